#include "tokenizer/streamer.h"

namespace tokenizer {
namespace {

bool ends_incomplete(const std::string& s) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  return s.size() >= kReplacement.size() && s.compare(s.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
}

}  // namespace

std::string TextStreamer::put(int64_t id) {
  ids_.push_back(id);
  const std::string text = tok_.decode(ids_, skip_special_);
  if (ends_incomplete(text) || text.size() < printed_) return "";
  std::string fresh = text.substr(printed_);
  printed_ = text.size();
  return fresh;
}

std::string TextStreamer::end() {
  const std::string text = tok_.decode(ids_, skip_special_);
  std::string rest = text.size() > printed_ ? text.substr(printed_) : "";
  printed_ = text.size();
  return rest;
}

}  // namespace tokenizer
