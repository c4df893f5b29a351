// A context-free grammar over bytes, and a matcher that follows it byte by byte: the engine under structured output
// (response_format json_object / json_schema, tool_choice "required" or a named function).
//
// The grammar has llama.cpp's GBNF form: rules, each a list of alternatives, each a sequence of symbols; a symbol is
// a set of bytes or a reference to a rule. The matcher keeps every way the bytes so far can continue as a stack of
// positions (the next symbol of each sequence entered, innermost last), normalized so that each stack's top is a
// byte set, or the stack is empty (the input is complete). A byte advances the stacks whose top admits it; none: the
// byte is refused. Left recursion is not allowed (the schema compiler never makes it); a reference that ends a
// sequence is a tail call, so `R ::= x R | ""` repeats without the stacks growing.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

namespace structured {

using ByteSet = std::bitset<256>;

struct Symbol {
  enum Kind : uint8_t { kBytes, kRule } kind;
  uint32_t id;  // a byte set's index (Grammar::byte_set) or a rule's
};
using Seq = std::vector<Symbol>;

Seq operator+(Seq a, const Seq& b);

class Grammar {
 public:
  // A new rule with no alternatives yet (so that it can be referenced before it is defined: recursion).
  uint32_t new_rule();
  void add_alternative(uint32_t rule, const Seq& seq);
  // A rule of these alternatives, as one symbol.
  Symbol rule_of(const std::vector<Seq>& alternatives);

  // Symbols.
  Symbol bytes(const ByteSet& set);
  Symbol byte(uint8_t b);
  Symbol range(uint8_t lo, uint8_t hi);  // [lo-hi]
  Seq literal(const std::string& text);  // the bytes of text, in order
  Seq star(const Seq& x);                // x*
  // x{lo,hi}: hi < 0 is unbounded. The optional copies nest (x (x (x)?)?)? so that each way has one parse.
  Seq repeat(const Seq& x, int64_t lo, int64_t hi);

  void set_root(uint32_t rule) { root_ = rule; }
  uint32_t root() const { return root_; }
  size_t rule_count() const { return rules_.size(); }

  // The flat program: element i is a byte set, a rule reference, or the end of an alternative.
  struct Element {
    enum Kind : uint8_t { kBytes, kRule, kEnd } kind;
    uint32_t id;
  };
  const Element& element(uint32_t pos) const { return elements_[pos]; }
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rules_[rule]; }
  const ByteSet& byte_set(uint32_t id) const { return sets_[id]; }

 private:
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> rules_;  // each alternative's first element
  std::vector<ByteSet> sets_;
  uint32_t root_ = 0;
};

// Where the input can be in the grammar: a set of normalized stacks (see above).
class Matcher {
 public:
  explicit Matcher(const Grammar& grammar);
  // Advances by one byte; false (and the matcher unchanged) when no parse admits it.
  bool accept(uint8_t byte);
  bool accept(const std::string& bytes);  // all of them, or (false) none
  bool can_end() const;    // the input so far is a complete sentence
  bool finished() const;   // complete, and nothing may follow (every stack is empty)
  bool dead() const { return stacks_.empty(); }
  // The bytes that may come next (the union of the stacks' tops).
  ByteSet next_bytes() const;

  using Stack = std::vector<uint32_t>;  // element positions, innermost last
  const std::vector<Stack>& stacks() const { return stacks_; }

 private:
  void normalize_into(Stack stack, std::vector<Stack>& out, int depth) const;
  const Grammar* grammar_;
  std::vector<Stack> stacks_;
};

}  // namespace structured
