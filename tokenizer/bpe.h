// The BPE model of tokenizer.json (HF tokenizers' models/bpe): a vocabulary, ranked merges, and for a piece
// the merges applied lowest rank first. Options: byte_fallback (<0xXX> tokens for characters outside the
// vocabulary), unk_token and fuse_unk, ignore_merges (a piece in the vocabulary is one token: Llama 3).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace tokenizer {

class Bpe {
 public:
  explicit Bpe(const nlohmann::json& model);  // tokenizer.json's "model"; throws Error for what it lacks
  void encode(const std::string& piece, std::vector<int64_t>& ids) const;  // appends the piece's ids
  std::optional<int64_t> token_to_id(const std::string& token) const;
  const std::string* id_to_token(int64_t id) const;  // null when the id is not in the vocabulary
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }

 private:
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;
  // (left id << 32 | right id) -> rank and merged id: an open-addressing table (the node-based
  // unordered_map's cache misses were a fifth of the encode time).
  struct Merge {
    uint64_t key = kEmpty;
    int64_t rank = 0, id = 0;
  };
  static constexpr uint64_t kEmpty = ~0ULL;
  std::vector<Merge> merges_;
  int shift_ = 64;
  void add_merge(uint64_t key, int64_t rank, int64_t id);
  const Merge* find_merge(int64_t left, int64_t right) const;
  std::optional<int64_t> unk_;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
};

}  // namespace tokenizer
