// Generated text on a terminal: a random or small model can draw control bytes (ESC, BEL, a lone C1 byte, bytes that
// are not UTF-8) that a terminal would act on. When stdout is a terminal (or, under tprun, whose ranks write to a pipe,
// tprun's is: TPRUN_STDOUT_IS_TERMINAL=1), they are shown escaped (\x1b); in a file or a pipe the bytes go out
// unchanged (they are the model's output).
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace tools_cli {

// `text` with C0 controls (but newline and tab), DEL, C1 controls and bytes outside valid UTF-8 as \xNN.
inline std::string printable(const std::string& text) {
  std::string out;
  auto escape = [&](unsigned char b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\x%02x", b);
    out += buf;
  };
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) escape(c); else out += static_cast<char>(c);
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
    const size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = n > 0 && i + n <= text.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    if (ok) {
      const unsigned char second = static_cast<unsigned char>(text[i + 1]);
      if ((c == 0xe0 && second < 0xa0) || (c == 0xed && second > 0x9f) || (c == 0xf0 && second < 0x90) ||
          (c == 0xf4 && second > 0x8f) || (c == 0xc2 && second < 0xa0)) {
        ok = false;  // overlong, a surrogate, past U+10FFFF, or a C1 control (U+0080-U+009F)
      }
    }
    if (!ok) {
      escape(c);
      ++i;
      continue;
    }
    out.append(text, i, n);
    i += n;
  }
  return out;
}

// printable(text) when stdout is a terminal, else text.
inline std::string for_stdout(const std::string& text) {
  static const bool terminal = ::isatty(1) != 0 || (std::getenv("TPRUN_STDOUT_IS_TERMINAL") != nullptr &&
                                                     std::string(std::getenv("TPRUN_STDOUT_IS_TERMINAL")) == "1");
  return terminal ? printable(text) : text;
}

}  // namespace tools_cli
