// A Hugging Face tokenizer in C++: what transformers' AutoTokenizer.from_pretrained(dir) gives, read from the
// checkpoint's tokenizer.json (with tokenizer_config.json, special_tokens_map.json and generation_config.json
// for bos, eos and pad):
//
//   auto tok = tokenizer::Tokenizer::from_pretrained(dir);
//   std::vector<int64_t> ids = tok.encode("Hello world");   // with the post-processor's bos, as HF
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// The pipeline is tokenizer.json's: added tokens split out first (special and non-normalized ones on the raw
// text, normalized ones after the normalizer), then normalizer, pre-tokenizer (pipeline.h), BPE (bpe.h) and
// the post-processor (TemplateProcessing, ByteLevel, Sequence). Decoding runs the decoder and, when
// tokenizer_config.json asks, transformers' clean_up_tokenization. Anything else is a tokenizer::Error naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tokenizer {

struct AddedToken {
  int64_t id = 0;
  std::string content;
  bool special = false, normalized = true, lstrip = false, rstrip = false, single_word = false;
};

class Tokenizer {
 public:
  // dir holds tokenizer.json (tokenizer.model alone is not read yet); throws Error naming what is missing.
  static Tokenizer from_pretrained(const std::string& dir);
  // tokenizer.json's text (no side files: no bos / eos / pad unless the post-processor names them).
  static Tokenizer from_json(const std::string& tokenizer_json, const std::string& origin = "tokenizer.json");
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int64_t> encode(const std::string& text, bool add_special_tokens = true) const;
  std::vector<std::vector<int64_t>> encode_batch(const std::vector<std::string>& texts, bool add_special_tokens = true) const;
  std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int64_t> token_to_id(const std::string& token) const;
  std::optional<std::string> id_to_token(int64_t id) const;
  int64_t vocab_size() const;  // the model's plus the added tokens (HF's len(tokenizer))
  std::optional<int64_t> bos_token_id() const;
  std::optional<int64_t> eos_token_id() const;
  std::optional<int64_t> pad_token_id() const;
  const std::vector<AddedToken>& added_tokens() const;

  struct Impl;  // tokenizer.cpp

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tokenizer
