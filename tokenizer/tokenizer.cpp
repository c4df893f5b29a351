#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <iterator>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "tokenizer/backend.h"
#include "tokenizer/error.h"
#include "tokenizer/text.h"

namespace fs = std::filesystem;

namespace tokenizer {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("tokenizer: cannot read '" + path + "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

nlohmann::json parse_json(const std::string& text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw Error("tokenizer: '" + origin + "' is not valid JSON: " + e.what());
  }
}

namespace {

// A special token named in tokenizer_config.json / special_tokens_map.json: "<s>" or {"content": "<s>", ...}.
std::optional<std::string> token_name(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  const auto& v = j.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v.at("content").get<std::string>();
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_json(const std::string& text, const std::string& origin) {
  return Tokenizer(tokenizer_json_backend(text, origin, nlohmann::json()));
}

Tokenizer Tokenizer::from_pretrained(const std::string& dir) {
  const fs::path d(dir);
  if (!fs::is_directory(d)) throw Error("tokenizer: '" + dir + "' is not a directory");
  nlohmann::json config = nlohmann::json::object();
  for (const char* file : {"special_tokens_map.json", "tokenizer_config.json"}) {  // the latter wins
    if (fs::exists(d / file)) config.update(parse_json(read_file((d / file).string()), (d / file).string()));
  }
  std::unique_ptr<Backend> backend;
  if (fs::exists(d / "tokenizer.json")) {  // transformers prefers it too
    backend = tokenizer_json_backend(read_file((d / "tokenizer.json").string()), (d / "tokenizer.json").string(), config);
  } else if (fs::exists(d / "tokenizer.model")) {
    backend = sentencepiece_backend((d / "tokenizer.model").string(), config);
  } else {
    throw Error("tokenizer: no tokenizer.json or tokenizer.model in '" + dir + "'");
  }
  Tokenizer tok(std::move(backend));
  auto id_of = [&](const char* key) -> std::optional<int64_t> {
    const auto name = token_name(config, key);
    if (!name) return std::nullopt;
    const auto id = tok.token_to_id(*name);
    if (!id) throw Error("tokenizer: " + std::string(key) + " '" + *name + "' of '" + dir + "' is not in the vocabulary");
    return id;
  };
  tok.bos_ = id_of("bos_token"), tok.eos_ = id_of("eos_token"), tok.pad_ = id_of("pad_token");
  if (fs::exists(d / "generation_config.json")) {  // generate()'s ids where the tokenizer names none
    const auto g = parse_json(read_file((d / "generation_config.json").string()), (d / "generation_config.json").string());
    auto first_id = [&](const char* key) -> std::optional<int64_t> {
      if (!g.contains(key) || g.at(key).is_null()) return std::nullopt;
      const auto& v = g.at(key);
      return v.is_array() ? (v.empty() ? std::nullopt : std::optional<int64_t>(v.at(0).get<int64_t>()))
                          : std::optional<int64_t>(v.get<int64_t>());
    };
    if (!tok.bos_) tok.bos_ = first_id("bos_token_id");
    if (!tok.eos_) tok.eos_ = first_id("eos_token_id");
    if (!tok.pad_) tok.pad_ = first_id("pad_token_id");
  }
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (const auto name = token_name(config, key)) tok.special_tokens_[key] = *name;
  }
  if (const auto source = ChatTemplate::read_source(dir)) {
    try {
      tok.chat_template_ = std::make_unique<ChatTemplate>(*source, tok.special_tokens_);
    } catch (const Error& e) {  // reported when the template is used: encode / decode need no template
      tok.chat_template_error_ = "tokenizer: the chat template of '" + dir + "': " + e.what();
    }
  }
  return tok;
}

std::string Tokenizer::apply_chat_template(const nlohmann::ordered_json& messages, const ChatOptions& options) const {
  if (!chat_template_error_.empty()) throw Error(chat_template_error_);
  if (!chat_template_) throw Error("tokenizer: this checkpoint has no chat template (chat_template.jinja or "
                                   "tokenizer_config.json's chat_template)");
  return chat_template_->apply(messages, options);
}

std::vector<int64_t> Tokenizer::encode(const std::string& text, bool add_special_tokens) const {
  return backend_->encode(text, add_special_tokens);
}

std::vector<std::vector<int64_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts, bool add_special_tokens) const {
  std::vector<std::vector<int64_t>> out;
  out.reserve(texts.size());
  for (const auto& t : texts) out.push_back(encode(t, add_special_tokens));
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens, UnknownIds unknown) const {
  if (unknown == UnknownIds::kError) return backend_->decode(ids, skip_special_tokens);
  std::vector<int64_t> known;
  known.reserve(ids.size());
  std::copy_if(ids.begin(), ids.end(), std::back_inserter(known), [&](int64_t id) { return has_id(id); });
  return backend_->decode(known, skip_special_tokens);
}

bool Tokenizer::has_id(int64_t id) const { return backend_->id_to_token(id).has_value(); }

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const { return backend_->token_to_id(token); }
std::optional<std::string> Tokenizer::id_to_token(int64_t id) const { return backend_->id_to_token(id); }

std::optional<std::string> Tokenizer::token_bytes(int64_t id) const {
  // An added token's text depends on the decoder's spacing around it (a Llama 2 tokenizer puts a space before one):
  // none, as a special token's.
  for (const AddedToken& a : backend_->added_tokens()) {
    if (a.id == id) return std::nullopt;
  }
  const std::optional<std::string> token = backend_->id_to_token(id);
  if (!token || backend_->is_control(id)) return std::nullopt;
  const std::string& t = *token;
  if (unsigned char byte = 0; byte_fallback_token(t, byte)) return std::string(1, static_cast<char>(byte));
  std::string bytes;
  if (backend_->byte_level()) return unicode_to_bytes(t, bytes) ? bytes : t;
  static const std::string kMetaspace = "\xE2\x96\x81";  // U+2581
  for (size_t at = t.find(kMetaspace), from = 0;; at = t.find(kMetaspace, from)) {
    bytes.append(t, from, at == std::string::npos ? std::string::npos : at - from);
    if (at == std::string::npos) break;
    bytes += ' ';
    from = at + kMetaspace.size();
  }
  return bytes;
}
int64_t Tokenizer::vocab_size() const { return backend_->vocab_size(); }
std::optional<int64_t> Tokenizer::bos_token_id() const { return bos_; }
std::optional<int64_t> Tokenizer::eos_token_id() const { return eos_; }
std::optional<int64_t> Tokenizer::pad_token_id() const { return pad_; }
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return backend_->added_tokens(); }

}  // namespace tokenizer
