#include "tokenizer/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "tokenizer/bpe.h"
#include "tokenizer/error.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/text.h"

namespace fs = std::filesystem;

namespace tokenizer {

struct Tokenizer::Impl {
  std::unique_ptr<Bpe> model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  Decoder decoder;
  std::vector<AddedToken> added;
  std::vector<std::string> added_patterns;  // content, normalized for normalized tokens
  std::map<int64_t, size_t> added_by_id;
  // TemplateProcessing's single sequence: a special token's ids, or the text's (empty vector marks it).
  std::vector<std::vector<int64_t>> template_single;
  bool clean_up_spaces = false;
  std::optional<int64_t> bos, eos, pad;

  // Leftmost-longest matches of the added tokens in `text` (normalized ones or the others), as
  // (begin, end, token index) with lstrip / rstrip widening the span over spaces.
  std::vector<std::tuple<size_t, size_t, size_t>> find_added(const std::string& text, bool normalized) const {
    std::vector<std::tuple<size_t, size_t, size_t>> out;
    size_t at = 0;
    while (at < text.size()) {
      size_t best = added.size(), best_len = 0;
      for (size_t i = 0; i < added.size(); ++i) {
        const std::string& p = added_patterns[i];
        if (p.empty() || p[0] != text[at] || added[i].normalized != normalized || p.size() <= best_len) continue;
        if (text.compare(at, p.size(), p) != 0) continue;
        if (added[i].single_word) {
          auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
          if ((at > 0 && word(text[at - 1])) || (at + p.size() < text.size() && word(text[at + p.size()]))) continue;
        }
        best = i, best_len = p.size();
      }
      if (best == added.size()) {
        ++at;
        continue;
      }
      size_t b = at, e = at + best_len;
      const size_t floor = out.empty() ? 0 : std::get<1>(out.back());
      if (added[best].lstrip) while (b > floor && std::isspace(static_cast<unsigned char>(text[b - 1]))) --b;
      if (added[best].rstrip) while (e < text.size() && std::isspace(static_cast<unsigned char>(text[e]))) ++e;
      out.emplace_back(b, e, best);
      at = e;
    }
    return out;
  }

  void encode_text(const std::string& normalized, bool first, std::vector<int64_t>& ids) const {
    for (const Piece& p : pre_tokenizer({{normalized, first}})) model->encode(p.text, ids);
  }

  // A raw segment between non-normalized added tokens: normalize it, split out the normalized added
  // tokens, and run the rest through pre-tokenizer and model.
  void encode_segment(const std::string& raw, bool starts_input, std::vector<int64_t>& ids) const {
    const std::string text = normalizer(raw);
    size_t at = 0;
    for (const auto& [b, e, i] : find_added(text, /*normalized=*/true)) {
      if (b > at) encode_text(text.substr(at, b - at), starts_input && at == 0, ids);
      ids.push_back(added[i].id);
      at = e;
    }
    if (at < text.size()) encode_text(text.substr(at), starts_input && at == 0, ids);
  }
};

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("tokenizer: cannot read '" + path.string() + "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json parse(const std::string& text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw Error("tokenizer: '" + origin + "' is not valid JSON: " + e.what());
  }
}

// transformers' clean_up_tokenization.
std::string clean_up(std::string s) {
  static const std::pair<const char*, const char*> kEdits[] = {{" .", "."},     {" ?", "?"},     {" !", "!"},
                                                               {" ,", ","},     {" ' ", "'"},    {" n't", "n't"},
                                                               {" 'm", "'m"},   {" 's", "'s"},   {" 've", "'ve"},
                                                               {" 're", "'re"}};
  for (const auto& [from, to] : kEdits) {
    const std::string f = from, t = to;
    for (size_t at = s.find(f); at != std::string::npos; at = s.find(f, at + t.size())) s.replace(at, f.size(), t);
  }
  return s;
}

// A special token named in tokenizer_config.json / special_tokens_map.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> token_name(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  const auto& v = j.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return std::nullopt;
}

void read_post_processor(const nlohmann::json& j, Tokenizer::Impl& impl) {
  if (j.is_null()) return;
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return;  // offsets only
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) read_post_processor(p, impl);
    return;
  }
  if (type != "TemplateProcessing") throw Error("tokenizer: post_processor type '" + type + "' is not supported");
  impl.template_single.clear();
  const auto& specials = j.at("special_tokens");
  for (const auto& item : j.at("single")) {
    if (item.contains("Sequence")) {
      impl.template_single.push_back({});
    } else {
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      if (!specials.contains(name)) throw Error("tokenizer: TemplateProcessing names '" + name + "' without its ids");
      impl.template_single.push_back(specials.at(name).at("ids").get<std::vector<int64_t>>());
    }
  }
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& origin) {
  const nlohmann::json j = parse(text, origin);
  auto impl = std::make_unique<Impl>();
  try {
    impl->model = std::make_unique<Bpe>(j.at("model"));
    impl->normalizer = make_normalizer(j.value("normalizer", nlohmann::json()));
    impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()));
    impl->decoder = make_decoder(j.value("decoder", nlohmann::json()));
    read_post_processor(j.value("post_processor", nlohmann::json()), *impl);
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      AddedToken t;
      t.id = a.at("id").get<int64_t>();
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.normalized = a.value("normalized", !t.special);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      t.single_word = a.value("single_word", false);
      impl->added_by_id[t.id] = impl->added.size();
      impl->added_patterns.push_back(t.normalized ? impl->normalizer(t.content) : t.content);
      impl->added.push_back(t);
    }
  } catch (const Error& e) {
    throw Error(std::string(e.what()) + " (in '" + origin + "')");
  } catch (const nlohmann::json::exception& e) {
    throw Error("tokenizer: '" + origin + "' is not a tokenizer.json we can read: " + e.what());
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::from_pretrained(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::exists(d / "tokenizer.json")) {
    if (fs::exists(d / "tokenizer.model")) {
      throw Error("tokenizer: '" + dir + "' has only tokenizer.model (SentencePiece); reading it is not supported yet");
    }
    throw Error("tokenizer: no tokenizer.json in '" + dir + "'");
  }
  Tokenizer tok = from_json(read_file(d / "tokenizer.json"), (d / "tokenizer.json").string());
  Impl& impl = *tok.impl_;
  nlohmann::json config = nlohmann::json::object();
  for (const char* file : {"special_tokens_map.json", "tokenizer_config.json"}) {  // the latter wins
    if (fs::exists(d / file)) config.update(parse(read_file(d / file), (d / file).string()));
  }
  // transformers >= 5 skips the clean-up for BPE models (it would eat real spaces before punctuation) unless
  // the config insists.
  impl.clean_up_spaces = config.value("clean_up_tokenization_spaces", false) &&
                         config.value("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", false);
  auto id_of = [&](const char* key) -> std::optional<int64_t> {
    const auto name = token_name(config, key);
    if (!name) return std::nullopt;
    const auto id = tok.token_to_id(*name);
    if (!id) throw Error("tokenizer: " + std::string(key) + " '" + *name + "' of '" + dir + "' is not in the vocabulary");
    return id;
  };
  impl.bos = id_of("bos_token"), impl.eos = id_of("eos_token"), impl.pad = id_of("pad_token");
  if (fs::exists(d / "generation_config.json")) {  // generate()'s ids where the tokenizer names none
    const auto g = parse(read_file(d / "generation_config.json"), (d / "generation_config.json").string());
    auto first_id = [&](const char* key) -> std::optional<int64_t> {
      if (!g.contains(key) || g.at(key).is_null()) return std::nullopt;
      const auto& v = g.at(key);
      return v.is_array() ? (v.empty() ? std::nullopt : std::optional<int64_t>(v.at(0).get<int64_t>()))
                          : std::optional<int64_t>(v.get<int64_t>());
    };
    if (!impl.bos) impl.bos = first_id("bos_token_id");
    if (!impl.eos) impl.eos = first_id("eos_token_id");
    if (!impl.pad) impl.pad = first_id("pad_token_id");
  }
  return tok;
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  size_t at = 0;
  for (const auto& [b, e, i] : impl_->find_added(text, /*normalized=*/false)) {
    if (b > at) impl_->encode_segment(text.substr(at, b - at), at == 0, ids);
    ids.push_back(impl_->added[i].id);
    at = e;
  }
  if (at < text.size()) impl_->encode_segment(text.substr(at), at == 0, ids);
  if (!add_special_tokens || impl_->template_single.empty()) return ids;
  std::vector<int64_t> out;
  for (const auto& part : impl_->template_single) {
    if (part.empty()) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), part.begin(), part.end());
    }
  }
  return out;
}

std::vector<std::vector<int64_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts, bool add_special_tokens) const {
  std::vector<std::vector<int64_t>> out;
  out.reserve(texts.size());
  for (const auto& t : texts) out.push_back(encode(t, add_special_tokens));
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
      // As HF tokenizers decodes it: a normalized added token as its normalized form (Llama 2's "▁<tok>").
      const AddedToken& t = impl_->added[it->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(impl_->added_patterns[it->second]);
      continue;
    }
    const std::string* t = impl_->model->id_to_token(id);
    if (t == nullptr) throw Error("tokenizer: decode: id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(*t);
  }
  std::string out;
  for (const auto& piece : impl_->decoder(tokens)) out += piece;
  return impl_->clean_up_spaces ? clean_up(out) : out;
}

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& t : impl_->added) {
    if (t.content == token) return t.id;
  }
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int64_t id) const {
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) return impl_->added[it->second].content;
  const std::string* t = impl_->model->id_to_token(id);
  return t ? std::optional<std::string>(*t) : std::nullopt;
}

int64_t Tokenizer::vocab_size() const {
  int64_t n = impl_->model->vocab_size();
  for (const auto& t : impl_->added) n = std::max(n, t.id + 1);
  return n;
}

std::optional<int64_t> Tokenizer::bos_token_id() const { return impl_->bos; }
std::optional<int64_t> Tokenizer::eos_token_id() const { return impl_->eos; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return impl_->pad; }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

}  // namespace tokenizer
