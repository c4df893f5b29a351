// The stages of a tokenizer.json pipeline (HF tokenizers' names), each built from its JSON object:
//   normalizer     text -> text               NFC, NFKC, NFD, NFKD, Prepend, Replace, Lowercase, Sequence
//   pre_tokenizer  pieces -> finer pieces     ByteLevel, Split, Metaspace, Digits, Sequence
//   decoder        tokens -> text pieces      ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence
// A type or option we do not implement is a tokenizer::Error naming it (never a silently different split).
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tokenizer {

using Normalizer = std::function<std::string(const std::string&)>;
// Splits each piece; `first` is whether a piece starts the input (Metaspace's prepend_scheme "first").
struct Piece {
  std::string text;
  bool first = false;
};
using PreTokenizer = std::function<std::vector<Piece>(const std::vector<Piece>&)>;
using Decoder = std::function<std::vector<std::string>(const std::vector<std::string>&)>;

// null JSON: the identity.
Normalizer make_normalizer(const nlohmann::json& j);
PreTokenizer make_pre_tokenizer(const nlohmann::json& j);
Decoder make_decoder(const nlohmann::json& j);

// The regex or string pattern of a Split / Replace ({"Regex": ...} or {"String": ...}) as a PCRE2 pattern.
std::string pattern_of(const nlohmann::json& pattern);

}  // namespace tokenizer
