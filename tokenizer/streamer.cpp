#include "tokenizer/streamer.h"

#include "tokenizer/text.h"

#include <algorithm>
#include <cctype>
#include <optional>

namespace tokenizer {
namespace {

constexpr size_t kContextTokens = 5;  // vLLM's INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET

bool ends_incomplete(const std::string& s) {
  static const std::string kReplacement = "\xEF\xBF\xBD";
  return s.size() >= kReplacement.size() && s.compare(s.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
}

// A byte-fallback piece "<0xAB>" (tokenizer.json's ByteFallback, SentencePiece's byte pieces). Its decode can
// still change: a run of such pieces that is not valid UTF-8 decodes to U+FFFD as a whole, even a valid "<0x59>"
// ("Y") at its start. So a stream waits for the run to end before printing any of it.
bool is_byte_piece(const std::optional<std::string>& piece) {
  unsigned char byte = 0;
  return piece && byte_fallback_token(*piece, byte);
}

bool starts_incomplete(const std::string& s) { return s.compare(0, 3, "\xEF\xBF\xBD") == 0; }

}  // namespace

std::string TextStreamer::window(size_t from, size_t to) const {
  return tok_.decode(std::vector<int64_t>(ids_.begin() + static_cast<std::ptrdiff_t>(from),
                                          ids_.begin() + static_cast<std::ptrdiff_t>(to)),
                     skip_special_, UnknownIds::kSkip);
}

void TextStreamer::prime(const std::vector<int64_t>& prompt) {
  ids_ = prompt;
  read_ = ids_.size();
  prefix_ = read_ - std::min(read_, kContextTokens);
  // The context must start on a character: a byte-fallback run that starts mid-character decodes to U+FFFD
  // as a whole, new bytes included.
  while (prefix_ > 0 && starts_incomplete(window(prefix_, read_))) --prefix_;
}

std::string TextStreamer::put(int64_t id) {
  ids_.push_back(id);
  if (is_byte_piece(tok_.id_to_token(id))) return "";
  // The text the unprinted tokens add to the context's: printable once it does not end inside a character.
  const std::string before = window(prefix_, read_);
  const std::string after = window(prefix_, ids_.size());
  if (ends_incomplete(after) || after.size() <= before.size()) return "";
  prefix_ = read_;
  read_ = ids_.size();
  return after.substr(before.size());
}

std::string TextStreamer::end() {
  const std::string before = window(prefix_, read_);
  const std::string after = window(prefix_, ids_.size());
  prefix_ = read_ = ids_.size();
  return after.size() > before.size() ? after.substr(before.size()) : "";
}

}  // namespace tokenizer
