// Normalizers: Unicode forms through utf8proc (Debian's libutf8proc), and the string edits the Llama-2 /
// Mistral / Gemma pipelines use.
#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "tokenizer/error.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/text.h"

namespace tokenizer {
namespace {

Normalizer unicode_form(utf8proc_option_t options, const std::string& name) {
  return [options, name](const std::string& s) {
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                &out, static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
    if (n < 0) throw Error("tokenizer: " + name + " normalizer: " + utf8proc_errmsg(n));
    std::string r(reinterpret_cast<char*>(out), static_cast<size_t>(n));
    std::free(out);
    return r;
  };
}

// Replace every match of `pattern` (a literal or a regex) by `content`.
Normalizer replace(const nlohmann::json& j) {
  auto re = std::make_shared<Regex>(pattern_of(j.at("pattern")));
  const std::string content = j.at("content").get<std::string>();
  return [re, content](const std::string& s) { return re->replace_all(s, content); };
}

}  // namespace

std::string pattern_of(const nlohmann::json& pattern) {
  if (pattern.contains("Regex")) return pattern.at("Regex").get<std::string>();
  if (pattern.contains("String")) return "\\Q" + pattern.at("String").get<std::string>() + "\\E";
  throw Error("tokenizer: a pattern must be {\"Regex\": ...} or {\"String\": ...}, got " + pattern.dump());
}

Normalizer make_normalizer(const nlohmann::json& j) {
  if (j.is_null()) return [](const std::string& s) { return s; };
  const std::string type = j.at("type").get<std::string>();
  if (type == "NFC") return unicode_form(UTF8PROC_COMPOSE, type);
  if (type == "NFD") return unicode_form(UTF8PROC_DECOMPOSE, type);
  if (type == "NFKC") return unicode_form(static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_COMPAT), type);
  if (type == "NFKD") return unicode_form(static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT), type);
  if (type == "Prepend") {
    const std::string prepend = j.at("prepend").get<std::string>();
    return [prepend](const std::string& s) { return s.empty() ? s : prepend + s; };
  }
  if (type == "Replace") return replace(j);
  if (type == "Sequence") {
    std::vector<Normalizer> parts;
    for (const auto& n : j.at("normalizers")) parts.push_back(make_normalizer(n));
    return [parts](const std::string& s) {
      std::string out = s;
      for (const auto& n : parts) out = n(out);
      return out;
    };
  }
  throw Error("tokenizer: normalizer type '" + type + "' is not supported");
}

}  // namespace tokenizer
