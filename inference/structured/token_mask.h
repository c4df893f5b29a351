// Which tokens may come next under a grammar: the vocabulary's bytes in a trie, walked through the grammar's states
// (a subtree is left as soon as its prefix is refused: inside a structure few tokens survive the first byte), and
// the naive reference beside it, each token tried alone (the tests compare them).
//
// The walk does not run the matcher per trie node: GrammarStates is a DFA built lazily over the matcher's states
// (each distinct set of stacks is one state, its successor by each byte computed once), so a node costs a table
// lookup. Inside a string almost the whole vocabulary survives, and the states are few (a string's state after a
// plain character is the state before it); a state's mask is kept for the next step, which often has the same state.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "inference/structured/grammar.h"

namespace structured {

class GrammarStates {
 public:
  // At most max_states states (about 1 KB each); a walk that needs more goes on through the matcher itself, and the
  // next walk starts the table again.
  explicit GrammarStates(const Grammar& grammar, size_t max_states = 8192) : grammar_(&grammar), max_states_(max_states) {}
  static constexpr int32_t kFull = -3;
  int32_t intern(const Matcher& m);            // the state of m's input; kFull when the table is full
  int32_t step(int32_t state, uint8_t byte);   // its successor by byte; -1: refused; kFull
  const Matcher& matcher(int32_t state) const { return states_[static_cast<size_t>(state)].matcher; }
  size_t size() const { return states_.size(); }
  void start_walk();                           // the table starts again if it is full

 private:
  struct State {
    Matcher matcher;
    bool can_end;
    std::array<int32_t, 256> next;  // -2: not computed yet
  };
  const Grammar* grammar_;
  size_t max_states_;
  std::vector<State> states_;
  std::map<std::vector<Matcher::Stack>, int32_t> index_;
  friend class TokenMask;
  // The last masks computed, by state (a string's state repeats step after step).
  std::vector<std::pair<int32_t, std::vector<uint8_t>>> masks_;
};

class TokenMask {
 public:
  // bytes[id]: what token id adds to the text (tokenizer::Tokenizer::token_bytes); nullopt or empty: never allowed.
  // stop_ids: allowed exactly when the grammar's input is complete. Ids past bytes.size() (the model's padding of
  // its vocabulary) are never allowed.
  TokenMask(const std::vector<std::optional<std::string>>& bytes, std::vector<int64_t> stop_ids);

  // allowed[id] = 1 when token id may follow the input `m` has seen (states: the DFA of m's grammar, kept between
  // steps; each request's choices share theirs).
  std::vector<uint8_t> allowed(GrammarStates& states, const Matcher& m) const;
  std::vector<uint8_t> allowed_naive(const Matcher& m) const;

  const std::optional<std::string>& bytes(int64_t id) const { return bytes_[static_cast<size_t>(id)]; }
  int64_t vocab_size() const { return static_cast<int64_t>(bytes_.size()); }
  bool is_stop(int64_t id) const;

 private:
  // The trie, flat (built by the constructor, then laid out in depth-first order): node n's edges are
  // edges_[edge_begin_[n], edge_begin_[n + 1]), the tokens whose bytes end at it ids_[id_begin_[n], id_begin_[n + 1]).
  struct Edge {
    uint8_t byte;
    uint32_t node;
  };
  std::vector<uint32_t> edge_begin_, id_begin_;
  std::vector<Edge> edges_;
  std::vector<int64_t> ids_;
  void walk(uint32_t node, GrammarStates& states, int32_t state, std::vector<uint8_t>& out) const;
  void walk_matcher(uint32_t node, const Matcher& m, std::vector<uint8_t>& out) const;
  void mark(uint32_t node, std::vector<uint8_t>& out) const;  // the tokens ending at node: allowed

  std::vector<std::optional<std::string>> bytes_;
  std::vector<int64_t> stop_ids_;
};

}  // namespace structured
