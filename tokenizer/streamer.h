// Decoded text as tokens arrive (transformers' TextStreamer): put() returns the text the new token completes.
// A byte-level or byte-fallback token may end inside a UTF-8 character; its text is held back (the decode ends
// in U+FFFD) until the character's last byte arrives, so a stream never prints half a character.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tokenizer {

class TextStreamer {
 public:
  explicit TextStreamer(const Tokenizer& tok, bool skip_special_tokens = true)
      : tok_(tok), skip_special_(skip_special_tokens) {}
  // The newly printable text after `id`.
  std::string put(int64_t id);
  // What is left (a trailing incomplete character, as U+FFFD), at the end of the stream.
  std::string end();
  const std::vector<int64_t>& ids() const { return ids_; }

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int64_t> ids_;
  size_t printed_ = 0;  // bytes of decode(ids_) already returned
};

}  // namespace tokenizer
