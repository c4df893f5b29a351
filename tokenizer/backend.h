// What a Tokenizer runs on: a tokenizer.json pipeline (tokenizer_json.cpp) or a SentencePiece model
// (sentencepiece.cpp). The Tokenizer (tokenizer.cpp) adds what the side files say: bos / eos / pad and the chat
// template.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/tokenizer.h"

namespace tokenizer {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::vector<int64_t> encode(const std::string& text, bool add_special_tokens) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const = 0;
  virtual std::optional<int64_t> token_to_id(const std::string& token) const = 0;
  virtual std::optional<std::string> id_to_token(int64_t id) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual const std::vector<AddedToken>& added_tokens() const = 0;
  // The vocabulary's tokens are GPT-2's byte-to-unicode strings (a ByteLevel decoder), not text with a metaspace.
  virtual bool byte_level() const { return false; }
  // A control or unknown piece of a SentencePiece model (<s>, </s>, <unk>): no text of its own.
  virtual bool is_control(int64_t /*id*/) const { return false; }
};

// tokenizer.json's text; `config` (tokenizer_config.json merged over special_tokens_map.json, or null) sets
// the decode's clean-up.
std::unique_ptr<Backend> tokenizer_json_backend(const std::string& text, const std::string& origin,
                                                const nlohmann::json& config);
// A SentencePiece tokenizer.model, with tokenizer_config.json's add_bos_token / add_eos_token.
std::unique_ptr<Backend> sentencepiece_backend(const std::string& model_path, const nlohmann::json& config);

// The tokenizer's file helpers: a file's bytes, and its JSON (an Error naming the file when it is not JSON).
std::string read_file(const std::string& path);
nlohmann::json parse_json(const std::string& text, const std::string& origin);

}  // namespace tokenizer
