// Which tokens may come next under a grammar: the vocabulary's bytes in a trie, walked with the grammar's matcher
// (a subtree is left as soon as its prefix is refused: inside a structure few tokens survive the first byte), and
// the naive reference beside it, each token tried alone (the tests compare them).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "inference/structured/grammar.h"

namespace structured {

class TokenMask {
 public:
  // bytes[id]: what token id adds to the text (tokenizer::Tokenizer::token_bytes); nullopt or empty: never allowed.
  // stop_ids: allowed exactly when the grammar's input is complete. Ids past bytes.size() (the model's padding of
  // its vocabulary) are never allowed.
  TokenMask(const std::vector<std::optional<std::string>>& bytes, std::vector<int64_t> stop_ids);

  // allowed[id] = 1 when token id may follow the input `m` has seen.
  std::vector<uint8_t> allowed(const Matcher& m) const;
  std::vector<uint8_t> allowed_naive(const Matcher& m) const;

  const std::optional<std::string>& bytes(int64_t id) const { return bytes_[static_cast<size_t>(id)]; }
  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  bool is_stop(int64_t id) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, uint32_t>> children;  // by byte
    std::vector<int64_t> ids;                            // the tokens whose bytes end here
  };
  void walk(uint32_t node, const Matcher& m, std::vector<uint8_t>& out) const;

  std::vector<std::optional<std::string>> bytes_;
  std::vector<int64_t> stop_ids_;
  std::vector<Node> nodes_;  // nodes_[0]: the root
};

}  // namespace structured
