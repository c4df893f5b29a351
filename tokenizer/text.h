// Text utilities the tokenizer pipeline shares: UTF-8 code points, GPT-2's byte-level alphabet, and regular
// expressions with Unicode properties through PCRE2 (Debian's libpcre2), as HF tokenizers' onig/fancy-regex.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tokenizer {

// The byte length of the UTF-8 sequence a lead byte starts (1 to 4), or 0 for a continuation or invalid byte.
size_t utf8_length(unsigned char lead);
// The code points of `s` as UTF-8 substrings (invalid bytes are single-byte pieces).
std::vector<std::string> utf8_chars(const std::string& s);

// GPT-2's bytes_to_unicode: each byte as a printable code point (UTF-8), and back.
const std::string& byte_to_unicode(uint8_t byte);
// The bytes of a byte-level token, or false when a character is not in the alphabet.
bool unicode_to_bytes(const std::string& token, std::string& bytes);
// A byte-fallback piece "<0xAB>" -> byte 0xAB; false for anything else.
bool byte_fallback_token(const std::string& token, unsigned char& byte);

// A compiled PCRE2 pattern (UTF, Unicode properties). Throws tokenizer::Error naming the pattern.
class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // [begin, end) byte offsets of every non-overlapping match, left to right.
  std::vector<std::pair<size_t, size_t>> find_all(const std::string& text) const;
  // `text` with every match replaced by `content` (the Replace normalizer and decoder).
  std::string replace_all(const std::string& text, const std::string& content) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
};

}  // namespace tokenizer
