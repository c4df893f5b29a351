// Decoded text as tokens arrive (transformers' TextStreamer): put() returns the text the new token completes.
// A byte-level or byte-fallback token may end inside a UTF-8 character; its text is held back (the decode ends
// in U+FFFD) until the character's last byte arrives, so a stream never prints half a character. A run of
// byte-fallback pieces ("<0xAB>") is held back whole until a piece of text ends it: if the run is not valid
// UTF-8, all of it decodes to U+FFFD, even the bytes that were valid alone.
//
// Incremental, as TGI and vLLM detokenize: each step decodes only a short window (the tokens since the last
// printed one, plus a few before them for context: a Metaspace or SentencePiece decoder drops the leading space
// of a window's first token, so the context token takes that loss). prime(prompt) gives the prompt as context,
// so the first new token keeps its leading space, as transformers' decode(prompt + new) has it. The naive
// reference is decode(all ids) each step: the tests compare the stream with it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tokenizer {

// A generated stream: ids outside the tokenizer's vocabulary (a padded embedding's rows) add nothing to the text, as in
// transformers' decode.
class TextStreamer {
 public:
  explicit TextStreamer(const Tokenizer& tok, bool skip_special_tokens = true)
      : tok_(tok), skip_special_(skip_special_tokens) {}
  // The tokens before the stream (not printed by put / end).
  void prime(const std::vector<int64_t>& prompt);
  // The newly printable text after `id`.
  std::string put(int64_t id);
  // What is left (a trailing incomplete character, as U+FFFD), at the end of the stream.
  std::string end();
  const std::vector<int64_t>& ids() const { return ids_; }

 private:
  std::string window(size_t from, size_t to) const;

  const Tokenizer& tok_;
  bool skip_special_;
  std::vector<int64_t> ids_;
  size_t prefix_ = 0;  // the window's first token (context)
  size_t read_ = 0;    // the first token not yet printed
};

}  // namespace tokenizer
