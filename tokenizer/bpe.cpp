#include "tokenizer/bpe.h"

#include <cstdio>
#include <limits>

#include "tokenizer/error.h"
#include "tokenizer/text.h"

namespace tokenizer {

Bpe::Bpe(const nlohmann::json& m) {
  const std::string type = m.value("type", std::string("BPE"));
  if (type != "BPE") throw Error("tokenizer: model type '" + type + "' is not supported (BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
    if (m.contains(key) && !m.at(key).is_null() && !(m.at(key).is_string() && m.at(key).get<std::string>().empty())) {
      throw Error(std::string("tokenizer: BPE option '") + key + "' is not supported");
    }
  }
  for (const auto& [token, id] : m.at("vocab").items()) {
    const int64_t i = id.get<int64_t>();
    vocab_[token] = i;
    if (static_cast<int64_t>(id_to_token_.size()) <= i) id_to_token_.resize(static_cast<size_t>(i) + 1);
    id_to_token_[static_cast<size_t>(i)] = token;
  }
  int64_t rank = 0;
  for (const auto& merge : m.at("merges")) {
    std::string left, right;
    if (merge.is_array()) {  // tokenizers >= 0.20: ["a", "b"]
      left = merge.at(0).get<std::string>(), right = merge.at(1).get<std::string>();
    } else {  // "a b"
      const std::string s = merge.get<std::string>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) throw Error("tokenizer: BPE merge '" + s + "' is not 'left right'");
      left = s.substr(0, space), right = s.substr(space + 1);
    }
    auto l = vocab_.find(left), r = vocab_.find(right), lr = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || lr == vocab_.end()) {
      throw Error("tokenizer: BPE merge '" + left + " " + right + "' names a token outside the vocabulary");
    }
    merges_.emplace((static_cast<uint64_t>(l->second) << 32) | static_cast<uint64_t>(r->second), Merge{rank++, lr->second});
  }
  if (m.contains("unk_token") && m.at("unk_token").is_string()) {
    auto it = vocab_.find(m.at("unk_token").get<std::string>());
    if (it != vocab_.end()) unk_ = it->second;
  }
  byte_fallback_ = m.value("byte_fallback", false);
  fuse_unk_ = m.value("fuse_unk", false);
  ignore_merges_ = m.value("ignore_merges", false);
}

std::optional<int64_t> Bpe::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Bpe::id_to_token(int64_t id) const {
  if (id < 0 || id >= vocab_size() || id_to_token_[static_cast<size_t>(id)].empty()) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

void Bpe::encode(const std::string& piece, std::vector<int64_t>& ids) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto it = vocab_.find(piece); it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  // The piece's characters as symbols; outside the vocabulary: byte tokens, or unk (runs fused).
  std::vector<int64_t> word;
  bool last_unk = false;
  for (const auto& ch : utf8_chars(piece)) {
    if (auto it = vocab_.find(ch); it != vocab_.end()) {
      word.push_back(it->second);
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      std::vector<int64_t> bytes;
      for (unsigned char c : ch) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", c);
        auto it = vocab_.find(name);
        if (it == vocab_.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == ch.size()) {
        word.insert(word.end(), bytes.begin(), bytes.end());
        last_unk = false;
        continue;
      }
    }
    if (!unk_) throw Error("tokenizer: the character '" + ch + "' is not in the vocabulary and there is no unk_token");
    if (!(fuse_unk_ && last_unk)) word.push_back(*unk_);
    last_unk = true;
  }
  // Merge the adjacent pair of the lowest rank until none is left (HF's merge_word).
  while (word.size() > 1) {
    int64_t best = std::numeric_limits<int64_t>::max(), merged = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      auto it = merges_.find((static_cast<uint64_t>(word[i]) << 32) | static_cast<uint64_t>(word[i + 1]));
      if (it != merges_.end() && it->second.rank < best) best = it->second.rank, merged = it->second.id, at = i;
    }
    if (merged < 0) break;
    word[at] = merged;
    word.erase(word.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  ids.insert(ids.end(), word.begin(), word.end());
}

}  // namespace tokenizer
