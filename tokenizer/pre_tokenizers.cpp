// Pre-tokenizers: how a normalized string is cut into the pieces BPE merges within (HF tokenizers'
// pre_tokenizers/*.rs). Splits keep every byte unless the behavior removes the matches.
#include <memory>

#include "tokenizer/error.h"
#include "tokenizer/pipeline.h"
#include "tokenizer/text.h"

namespace tokenizer {
namespace {

// GPT-2's split (ByteLevel with use_regex).
const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior behavior_of(const std::string& name) {
  if (name == "Removed") return Behavior::removed;
  if (name == "Isolated") return Behavior::isolated;
  if (name == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (name == "MergedWithNext") return Behavior::merged_with_next;
  if (name == "Contiguous") return Behavior::contiguous;
  throw Error("tokenizer: split behavior '" + name + "' is not supported");
}

// Cuts `piece` at the matches of `re` as `behavior` says; empty pieces are dropped.
void split(const Piece& piece, const Regex& re, Behavior behavior, std::vector<Piece>& out) {
  const std::string& s = piece.text;
  std::vector<std::pair<size_t, bool>> cuts;  // (end of a part, whether it is a match)
  size_t at = 0;
  for (const auto& [b, e] : re.find_all(s)) {
    if (b > at) cuts.emplace_back(b, false);
    cuts.emplace_back(e, true);
    at = e;
  }
  if (at < s.size()) cuts.emplace_back(s.size(), false);
  std::vector<std::pair<std::string, bool>> parts;  // (text, match)
  size_t start = 0;
  for (const auto& [end, match] : cuts) {
    parts.emplace_back(s.substr(start, end - start), match);
    start = end;
  }
  std::vector<std::string> pieces;
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto& [text, match] = parts[i];
    switch (behavior) {
      case Behavior::removed:
        if (!match) pieces.push_back(text);
        break;
      case Behavior::isolated:
        pieces.push_back(text);
        break;
      case Behavior::contiguous:
        if (match && i > 0 && parts[i - 1].second) {
          pieces.back() += text;
        } else {
          pieces.push_back(text);
        }
        break;
      case Behavior::merged_with_previous:
        if (match && !pieces.empty() && !parts[i - 1].second) {
          pieces.back() += text;
        } else {
          pieces.push_back(text);
        }
        break;
      case Behavior::merged_with_next:
        if (!match && i > 0 && parts[i - 1].second) {
          pieces.back() += text;
        } else {
          pieces.push_back(text);
        }
        break;
    }
  }
  bool first = piece.first;
  for (auto& p : pieces) {
    if (p.empty()) continue;
    out.push_back({std::move(p), first});
    first = false;
  }
}

PreTokenizer regex_split(std::shared_ptr<Regex> re, Behavior behavior) {
  return [re, behavior](const std::vector<Piece>& in) {
    std::vector<Piece> out;
    for (const auto& p : in) split(p, *re, behavior, out);
    return out;
  };
}

PreTokenizer byte_level(const nlohmann::json& j) {
  const bool add_prefix_space = j.value("add_prefix_space", false);
  const bool use_regex = j.value("use_regex", true);
  auto re = use_regex ? std::make_shared<Regex>(kGpt2Pattern) : nullptr;
  return [=](const std::vector<Piece>& in) {
    std::vector<Piece> cut;
    for (Piece p : in) {
      if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text = " " + p.text;
      if (re) {
        split(p, *re, Behavior::isolated, cut);
      } else {
        cut.push_back(p);
      }
    }
    for (auto& p : cut) {
      std::string mapped;
      for (unsigned char c : p.text) mapped += byte_to_unicode(c);
      p.text = std::move(mapped);
    }
    return cut;
  };
}

PreTokenizer metaspace(const nlohmann::json& j) {
  const std::string replacement = j.value("replacement", std::string("\xE2\x96\x81"));
  std::string scheme = j.value("prepend_scheme", std::string());
  if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";  // older files
  if (scheme != "always" && scheme != "first" && scheme != "never") {
    throw Error("tokenizer: Metaspace prepend_scheme '" + scheme + "' is not supported");
  }
  const bool do_split = j.value("split", true);
  auto re = std::make_shared<Regex>("\\Q" + replacement + "\\E");
  return [=](const std::vector<Piece>& in) {
    std::vector<Piece> out;
    for (const Piece& p : in) {
      Piece q{"", p.first};
      for (const auto& ch : utf8_chars(p.text)) q.text += ch == " " ? replacement : ch;
      const bool prepend = scheme == "always" || (scheme == "first" && p.first);
      if (prepend && q.text.compare(0, replacement.size(), replacement) != 0) q.text = replacement + q.text;
      if (do_split) {
        split(q, *re, Behavior::merged_with_next, out);
      } else if (!q.text.empty()) {
        out.push_back(q);
      }
    }
    return out;
  };
}

}  // namespace

PreTokenizer make_pre_tokenizer(const nlohmann::json& j) {
  if (j.is_null()) return [](const std::vector<Piece>& in) { return in; };
  const std::string type = j.at("type").get<std::string>();
  if (type == "ByteLevel") return byte_level(j);
  if (type == "Metaspace") return metaspace(j);
  if (type == "Split") {
    if (j.value("invert", false)) throw Error("tokenizer: Split with invert is not supported");
    return regex_split(std::make_shared<Regex>(pattern_of(j.at("pattern"))), behavior_of(j.at("behavior").get<std::string>()));
  }
  if (type == "Digits") {
    const bool individual = j.value("individual_digits", false);
    return regex_split(std::make_shared<Regex>(individual ? "\\p{Nd}" : "\\p{Nd}+"), Behavior::isolated);
  }
  if (type == "Sequence") {
    std::vector<PreTokenizer> parts;
    for (const auto& p : j.at("pretokenizers")) parts.push_back(make_pre_tokenizer(p));
    return [parts](const std::vector<Piece>& in) {
      std::vector<Piece> out = in;
      for (const auto& p : parts) out = p(out);
      return out;
    };
  }
  throw Error("tokenizer: pre_tokenizer type '" + type + "' is not supported");
}

}  // namespace tokenizer
