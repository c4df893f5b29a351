// A Hugging Face tokenizer in C++: what transformers' AutoTokenizer.from_pretrained(dir) gives, read from the
// checkpoint's tokenizer.json (or, failing that, its SentencePiece tokenizer.model), with tokenizer_config.json,
// special_tokens_map.json and generation_config.json for bos, eos and pad, and the checkpoint's chat template:
//
//   auto tok = tokenizer::Tokenizer::from_pretrained(dir);
//   std::vector<int64_t> ids = tok.encode("Hello world");   // with the post-processor's bos, as HF
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//   std::string prompt = tok.apply_chat_template(messages, {.add_generation_prompt = true});
//
// backend.h says what runs underneath. Anything we cannot read is a tokenizer::Error naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tokenizer/chat_template.h"

namespace tokenizer {

class Backend;  // backend.h

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false, normalized = true, lstrip = false, rstrip = false, single_word = false;
};

// What decode does with an id outside the vocabulary (neither the model's nor an added token). A model's embedding may
// be padded past its tokenizer (Qwen2: 151,936 rows for 151,665 tokens; Phi-3: 32,064 for 32,011), so it can draw
// such ids: kSkip decodes them to nothing, as transformers' (fast) decode does; kError throws Error naming the id.
enum class UnknownIds { kError, kSkip };

class Tokenizer {
 public:
  // dir holds tokenizer.json or tokenizer.model; throws Error naming what is missing.
  static Tokenizer from_pretrained(const std::string& dir);
  // tokenizer.json's text (no side files: no bos / eos / pad unless the post-processor names them).
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& origin = "tokenizer.json");
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;
  std::vector<std::vector<int64_t>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false,
                     UnknownIds unknown = UnknownIds::kError) const;
  // Whether `id` is a token of this tokenizer (the model's vocabulary or an added token).
  bool has_id(int64_t id) const;

  std::optional<int64_t> token_to_id(const std::string& token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  // The bytes token `id` adds to decoded text (a byte-level token's bytes, "<0xAB>" byte 0xAB, a metaspace as a
  // space); nullopt for an added token (special or not), a SentencePiece control piece, or an id outside the vocabulary.
  // A token may be part of a UTF-8 character. What structured output masks the vocabulary by.
  std::optional<std::string> token_bytes(int64_t id) const;
  int64_t vocab_size() const;  // the model's plus the added tokens (HF's len(tokenizer))
  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> eos_token_id() const;
  std::optional<int64_t> pad_token_id() const;
  const std::vector<AddedToken>& added_tokens() const;
  // transformers' special_tokens_map: {"bos_token": "<s>", ...}, the named ones that are set.
  const nlohmann::ordered_json& special_tokens_map() const { return special_tokens_; }

  // The checkpoint's chat template rendered for `messages` (transformers' apply_chat_template with
  // tokenize=False); encode the result with add_special_tokens=false, as transformers does. Throws Error when
  // the checkpoint has no template or uses a construct outside our Jinja subset.
  std::string apply_chat_template(const nlohmann::ordered_json& messages, const ChatOptions& options = {}) const;
  bool has_chat_template() const { return chat_template_ != nullptr || !chat_template_error_.empty(); }

 private:
  explicit Tokenizer(std::unique_ptr<Backend> backend);
  std::unique_ptr<Backend> backend_;
  std::optional<int64_t> bos_, eos_, pad_;
  nlohmann::ordered_json special_tokens_ = nlohmann::ordered_json::object();
  std::unique_ptr<ChatTemplate> chat_template_;
  std::string chat_template_error_;  // why the checkpoint's template could not be parsed
};

}  // namespace tokenizer
