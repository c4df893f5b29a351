#include "tokenizer/bpe.h"

#include <cstdio>
#include <functional>
#include <limits>
#include <queue>

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
  const auto& merge_list = m.at("merges");
  size_t capacity = 16;
  while (capacity < 2 * merge_list.size()) capacity *= 2;
  merges_.assign(capacity, Merge{});
  shift_ = 64 - __builtin_ctzll(capacity);
  int64_t rank = 0;
  for (const auto& merge : merge_list) {
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
    add_merge((static_cast<uint64_t>(l->second) << 32) | static_cast<uint64_t>(r->second), rank++, lr->second);
  }
  if (m.contains("unk_token") && m.at("unk_token").is_string()) {
    auto it = vocab_.find(m.at("unk_token").get<std::string>());
    if (it != vocab_.end()) unk_ = it->second;
  }
  byte_fallback_ = m.value("byte_fallback", false);
  fuse_unk_ = m.value("fuse_unk", false);
  ignore_merges_ = m.value("ignore_merges", false);
}

void Bpe::add_merge(uint64_t key, int64_t rank, int64_t id) {
  const size_t mask = merges_.size() - 1;
  for (size_t i = (key * 0x9E3779B97F4A7C15ULL) >> shift_;; i = (i + 1) & mask) {
    if (merges_[i].key == key) return;  // a repeated merge keeps its first (lowest) rank
    if (merges_[i].key == kEmpty) {
      merges_[i] = {key, rank, id};
      return;
    }
  }
}

const Bpe::Merge* Bpe::find_merge(int64_t left, int64_t right) const {
  const uint64_t key = (static_cast<uint64_t>(left) << 32) | static_cast<uint64_t>(right);
  const size_t mask = merges_.size() - 1;
  for (size_t i = (key * 0x9E3779B97F4A7C15ULL) >> shift_;; i = (i + 1) & mask) {
    if (merges_[i].key == key) return &merges_[i];
    if (merges_[i].key == kEmpty) return nullptr;
  }
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
  // Merge the adjacent pair of the lowest rank (leftmost among equals) until none is left: HF's merge_word,
  // with a heap of candidate pairs over a linked list of symbols (O(n log n); the naive rescan is O(n^2) on
  // the long pieces of pipelines without a pre-tokenizer, such as Llama 2's).
  if (word.size() > 1 && word.size() <= 16) {
    // Short pieces (most byte-level words): rescan for the best pair each time, the reference algorithm.
    while (word.size() > 1) {
      int64_t best = std::numeric_limits<int64_t>::max(), merged = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < word.size(); ++i) {
        const Merge* mg = find_merge(word[i], word[i + 1]);
        if (mg != nullptr && mg->rank < best) best = mg->rank, merged = mg->id, at = i;
      }
      if (merged < 0) break;
      word[at] = merged;
      word.erase(word.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
  } else if (word.size() > 1) {
    const size_t n = word.size();
    std::vector<int64_t> prev(n), next(n);
    for (size_t i = 0; i < n; ++i) prev[i] = static_cast<int64_t>(i) - 1, next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
    struct Candidate {
      int64_t rank, pos, left, right, merged;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto push = [&](int64_t i) {
      if (i < 0 || next[static_cast<size_t>(i)] < 0) return;
      const int64_t j = next[static_cast<size_t>(i)];
      const int64_t l = word[static_cast<size_t>(i)], r = word[static_cast<size_t>(j)];
      if (const Merge* mg = find_merge(l, r)) heap.push({mg->rank, i, l, r, mg->id});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      const Candidate cand = heap.top();
      heap.pop();
      const auto i = static_cast<size_t>(cand.pos);
      // Stale: the symbol or its right neighbour changed since the pair was pushed.
      if (!alive[i] || next[i] < 0 || word[i] != cand.left || word[static_cast<size_t>(next[i])] != cand.right) continue;
      const auto j = static_cast<size_t>(next[i]);
      word[i] = cand.merged;
      alive[j] = false;
      next[i] = next[j];
      if (next[j] >= 0) prev[static_cast<size_t>(next[j])] = static_cast<int64_t>(i);
      push(prev[i]);
      push(static_cast<int64_t>(i));
    }
    std::vector<int64_t> merged;
    for (int64_t i = 0; i >= 0; i = next[static_cast<size_t>(i)]) merged.push_back(word[static_cast<size_t>(i)]);
    word.swap(merged);
  }
  ids.insert(ids.end(), word.begin(), word.end());
}

}  // namespace tokenizer
