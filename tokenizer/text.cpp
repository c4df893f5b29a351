#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/text.h"

#include <pcre2.h>

#include <array>
#include <map>

#include "tokenizer/error.h"

namespace tokenizer {

size_t utf8_length(unsigned char c) { return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0; }

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = utf8_length(static_cast<unsigned char>(s[i]));
    if (n == 0 || i + n > s.size()) n = 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

namespace {

std::string encode_utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// GPT-2: printable Latin-1 bytes map to themselves, the other 68 to U+0100 upwards, in byte order.
struct ByteLevelAlphabet {
  std::array<std::string, 256> to_unicode;
  std::map<std::string, uint8_t> to_byte;
  ByteLevelAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_unicode[b] = encode_utf8(printable ? static_cast<uint32_t>(b) : next++);
      to_byte[to_unicode[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteLevelAlphabet& alphabet() {
  static const ByteLevelAlphabet a;
  return a;
}

}  // namespace

const std::string& byte_to_unicode(uint8_t byte) { return alphabet().to_unicode[byte]; }

bool byte_fallback_token(const std::string& t, unsigned char& byte) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
  const std::string hex = t.substr(3, 2);
  if (hex.find_first_not_of("0123456789ABCDEFabcdef") != std::string::npos) return false;
  byte = static_cast<unsigned char>(std::stoi(hex, nullptr, 16));
  return true;
}

bool unicode_to_bytes(const std::string& token, std::string& bytes) {
  bytes.clear();
  for (const auto& ch : utf8_chars(token)) {
    auto it = alphabet().to_byte.find(ch);
    if (it == alphabet().to_byte.end()) return false;
    bytes += static_cast<char>(it->second);
  }
  return true;
}

Regex::Regex(const std::string& pattern) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                        &offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error("tokenizer: regex '" + pattern + "' does not compile at offset " + std::to_string(offset) + ": " +
                reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(static_cast<pcre2_code*>(code_), PCRE2_JIT_COMPLETE);  // a speed-up when available
}

std::string Regex::replace_all(const std::string& text, const std::string& content) const {
  std::string out;
  size_t at = 0;
  for (const auto& [b, e] : find_all(text)) {
    out.append(text, at, b - at);
    out += content;
    at = e;
  }
  out.append(text, at, std::string::npos);
  return out;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

std::vector<std::pair<size_t, size_t>> Regex::find_all(const std::string& text) const {
  std::vector<std::pair<size_t, size_t>> out;
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  size_t start = 0;
  while (start <= text.size()) {
    // PCRE2_NO_UTF_CHECK: invalid UTF-8 is the caller's (tokenizers work on valid strings).
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start, 0, md, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t b = ov[0], e = ov[1];
    if (e == b) {  // empty match: step one character on
      if (b >= text.size()) break;
      size_t n = 1;
      while (b + n < text.size() && (static_cast<unsigned char>(text[b + n]) & 0xC0) == 0x80) ++n;
      start = b + n;
      continue;
    }
    out.emplace_back(b, e);
    start = e;
  }
  pcre2_match_data_free(md);
  return out;
}

}  // namespace tokenizer
