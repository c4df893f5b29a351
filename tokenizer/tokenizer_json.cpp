// The tokenizer.json backend, as HF tokenizers runs it: added tokens split out first (special and non-normalized
// ones on the raw text, normalized ones after the normalizer), then normalizer, pre-tokenizer (pipeline.h), BPE
// (bpe.h) and the post-processor (TemplateProcessing, ByteLevel, Sequence). Decoding runs the decoder and, when
// tokenizer_config.json asks, transformers' clean_up_tokenization.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "tokenizer/backend.h"
#include "tokenizer/bpe.h"
#include "tokenizer/error.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/text.h"

namespace tokenizer {
namespace {

struct JsonBackend;
void read_post_processor(const nlohmann::json& j, JsonBackend& impl);
std::string clean_up(std::string s);

struct JsonBackend final : Backend {
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

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const override;
  std::optional<int64_t> token_to_id(const std::string& token) const override;
  std::optional<std::string> id_to_token(int64_t id) const override;
  int64_t vocab_size() const override;
  const std::vector<AddedToken>& added_tokens() const override { return added; }
  bool byte_level() const override { return is_byte_level; }
  bool is_byte_level = false;
};

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

void read_post_processor(const nlohmann::json& j, JsonBackend& impl) {
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

std::vector<int64_t> JsonBackend::encode(const std::string& text, bool add_special_tokens) const {
  std::vector<int64_t> ids;
  size_t at = 0;
  for (const auto& [b, e, i] : find_added(text, /*normalized=*/false)) {
    if (b > at) encode_segment(text.substr(at, b - at), at == 0, ids);
    ids.push_back(added[i].id);
    at = e;
  }
  if (at < text.size()) encode_segment(text.substr(at), at == 0, ids);
  if (!add_special_tokens || template_single.empty()) return ids;
  std::vector<int64_t> out;
  for (const auto& part : template_single) {
    if (part.empty()) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), part.begin(), part.end());
    }
  }
  return out;
}

std::string JsonBackend::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    if (auto it = added_by_id.find(id); it != added_by_id.end()) {
      // As HF tokenizers decodes it: a normalized added token as its normalized form (Llama 2's "▁<tok>").
      const AddedToken& t = added[it->second];
      if (!(skip_special_tokens && t.special)) tokens.push_back(added_patterns[it->second]);
      continue;
    }
    const std::string* t = model->id_to_token(id);
    if (t == nullptr) throw Error("tokenizer: decode: id " + std::to_string(id) + " is not in the vocabulary");
    tokens.push_back(*t);
  }
  std::string out;
  for (const auto& piece : decoder(tokens)) out += piece;
  return clean_up_spaces ? clean_up(out) : out;
}

std::optional<int64_t> JsonBackend::token_to_id(const std::string& token) const {
  for (const auto& t : added) {
    if (t.content == token) return t.id;
  }
  return model->token_to_id(token);
}

std::optional<std::string> JsonBackend::id_to_token(int64_t id) const {
  if (auto it = added_by_id.find(id); it != added_by_id.end()) return added[it->second].content;
  const std::string* t = model->id_to_token(id);
  return t ? std::optional<std::string>(*t) : std::nullopt;
}

int64_t JsonBackend::vocab_size() const {
  int64_t n = model->vocab_size();
  for (const auto& t : added) n = std::max(n, t.id + 1);
  return n;
}

}  // namespace

std::unique_ptr<Backend> tokenizer_json_backend(const std::string& text, const std::string& origin,
                                                const nlohmann::json& config) {
  const nlohmann::json j = parse_json(text, origin);
  auto impl = std::make_unique<JsonBackend>();
  try {
    impl->model = std::make_unique<Bpe>(j.at("model"));
    impl->normalizer = make_normalizer(j.value("normalizer", nlohmann::json()));
    impl->pre_tokenizer = make_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()));
    impl->decoder = make_decoder(j.value("decoder", nlohmann::json()));
    impl->is_byte_level = j.value("decoder", nlohmann::json()).dump().find("\"ByteLevel\"") != std::string::npos;
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
  // transformers >= 5 skips the clean-up for BPE models (it would eat real spaces before punctuation) unless
  // the config insists.
  if (config.is_object()) {
    impl->clean_up_spaces = config.value("clean_up_tokenization_spaces", false) &&
                            config.value("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output", false);
  }
  return impl;
}

}  // namespace tokenizer
