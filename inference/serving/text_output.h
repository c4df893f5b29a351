// A sequence's text as its tokens are drawn: the tokenizer's incremental decode (tokenizer::TextStreamer, primed
// with the prompt) and the request's stop strings. put() returns only text that is final: a tail that could be the
// start of a stop string is held back until the next token settles it, so streamed text never shows what a stop
// string later removes, and the pieces of a stream add up to the whole response's text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/streamer.h"

namespace serve {

class TextOutput {
 public:
  TextOutput(const tokenizer::Tokenizer& tok, const std::vector<int64_t>& prompt, std::vector<std::string> stop);
  std::string put(int64_t id);  // the newly final text after token `id`
  std::string end();            // the rest, when the sequence ends without a stop string
  bool stopped() const { return stopped_; }  // a stop string appeared (the text ends before it)

 private:
  std::string settle(bool last);
  tokenizer::TextStreamer streamer_;
  std::vector<std::string> stop_;
  std::string text_;
  size_t sent_ = 0;
  bool stopped_ = false;
};

}  // namespace serve
