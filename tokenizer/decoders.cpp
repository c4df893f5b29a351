// Decoders: tokens back to text (HF tokenizers' decoders/*.rs). Each maps the list of token strings to a
// new list; the tokenizer joins the last one.
#include <memory>

#include "tokenizer/error.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/text.h"

namespace tokenizer {
namespace {

const char* const kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length(static_cast<unsigned char>(s[i]));
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

// The bytes of a byte-level token sequence, then read as UTF-8 (invalid sequences become U+FFFD, as
// Rust's from_utf8_lossy does).
std::string lossy_utf8(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    size_t n = utf8_length(static_cast<unsigned char>(bytes[i]));
    bool ok = n > 0 && i + n <= bytes.size();
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (ok) {
      out.append(bytes, i, n);
      i += n;
    } else {
      out += kReplacementChar;
      ++i;
      while (i < bytes.size() && (static_cast<unsigned char>(bytes[i]) & 0xC0) == 0x80 && n > 1) { ++i; --n; }
    }
  }
  return out;
}

Decoder byte_level() {
  return [](const std::vector<std::string>& tokens) {
    std::string bytes, b;
    for (const auto& t : tokens) bytes += unicode_to_bytes(t, b) ? b : t;  // not byte-level: as it is
    return std::vector<std::string>{lossy_utf8(bytes)};
  };
}

Decoder byte_fallback() {
  return [](const std::vector<std::string>& tokens) {
    std::vector<std::string> out;
    std::string bytes;
    size_t pending = 0;
    auto flush = [&] {
      if (pending == 0) return;
      if (valid_utf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < pending; ++i) out.push_back(kReplacementChar);
      }
      bytes.clear();
      pending = 0;
    };
    for (const auto& t : tokens) {
      unsigned char byte = 0;
      if (byte_fallback_token(t, byte)) {
        bytes += static_cast<char>(byte);
        ++pending;
      } else {
        flush();
        out.push_back(t);
      }
    }
    flush();
    return out;
  };
}

Decoder strip(const nlohmann::json& j) {
  const std::string content = j.at("content").get<std::string>();
  const size_t left = j.value("start", 0), right = j.value("stop", 0);
  return [=](const std::vector<std::string>& tokens) {
    std::vector<std::string> out;
    for (const auto& t : tokens) {
      auto chars = utf8_chars(t);
      size_t b = 0, e = chars.size();
      while (b < e && b < left && chars[b] == content) ++b;
      while (e > b && chars.size() - e < right && chars[e - 1] == content) --e;
      std::string s;
      for (size_t i = b; i < e; ++i) s += chars[i];
      out.push_back(s);
    }
    return out;
  };
}

Decoder metaspace(const nlohmann::json& j) {
  const std::string replacement = j.value("replacement", std::string("\xE2\x96\x81"));
  std::string scheme = j.value("prepend_scheme", std::string());
  if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
  return [=](const std::vector<std::string>& tokens) {
    std::vector<std::string> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string s;
      for (const auto& ch : utf8_chars(tokens[i])) s += ch == replacement ? " " : ch;
      if (i == 0 && scheme != "never" && !s.empty() && s[0] == ' ') s.erase(0, 1);
      out.push_back(s);
    }
    return out;
  };
}

}  // namespace

Decoder make_decoder(const nlohmann::json& j) {
  if (j.is_null()) return [](const std::vector<std::string>& t) { return t; };
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return byte_level();
  if (type == "ByteFallback") return byte_fallback();
  if (type == "Fuse") {
    return [](const std::vector<std::string>& tokens) {
      std::string all;
      for (const auto& t : tokens) all += t;
      return std::vector<std::string>{all};
    };
  }
  if (type == "Strip") return strip(j);
  if (type == "Metaspace") return metaspace(j);
  if (type == "Replace") {
    auto re = std::make_shared<Regex>(pattern_of(j.at("pattern")));
    const std::string content = j.at("content").get<std::string>();
    return [re, content](const std::vector<std::string>& tokens) {
      std::vector<std::string> out;
      for (const auto& t : tokens) out.push_back(re->replace_all(t, content));
      return out;
    };
  }
  if (type == "Sequence") {
    std::vector<Decoder> parts;
    for (const auto& d : j.at("decoders")) parts.push_back(make_decoder(d));
    return [parts](const std::vector<std::string>& tokens) {
      std::vector<std::string> out = tokens;
      for (const auto& d : parts) out = d(out);
      return out;
    };
  }
  throw Error("tokenizer: decoder type '" + type + "' is not supported");
}

}  // namespace tokenizer
