#include "inference/serving/text_output.h"

#include <algorithm>

namespace serve {

TextOutput::TextOutput(const tokenizer::Tokenizer& tok, const std::vector<int64_t>& prompt, std::vector<std::string> stop)
    : streamer_(tok, /*skip_special_tokens=*/true), stop_(std::move(stop)) {
  streamer_.prime(prompt);
}

std::string TextOutput::put(int64_t id) {
  if (stopped_) return "";
  text_ += streamer_.put(id);
  return settle(false);
}

std::string TextOutput::end() {
  if (stopped_) return "";
  text_ += streamer_.end();
  return settle(true);
}

std::string TextOutput::settle(bool last) {
  // The earliest stop string in the text (none can end inside the part already sent: that was held back).
  size_t longest = 0;
  for (const auto& s : stop_) longest = std::max(longest, s.size());
  const size_t from = sent_ >= longest ? sent_ - longest + 1 : 0;
  size_t cut = std::string::npos;
  for (const auto& s : stop_) cut = std::min(cut, text_.find(s, from));
  if (cut != std::string::npos) {
    text_.resize(cut);
    stopped_ = true;
    last = true;
  }
  size_t ready = text_.size();
  if (!last) {
    // Hold back the longest tail that begins some stop string.
    for (const auto& s : stop_) {
      for (size_t k = std::min(s.size() - 1, text_.size()); k > 0; --k) {
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          ready = std::min(ready, text_.size() - k);
          break;
        }
      }
    }
  }
  ready = std::max(ready, sent_);
  std::string out = text_.substr(sent_, ready - sent_);
  sent_ = ready;
  return out;
}

}  // namespace serve
