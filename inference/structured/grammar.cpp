#include "inference/structured/grammar.h"

#include <algorithm>
#include <stdexcept>

namespace structured {

Seq operator+(Seq a, const Seq& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

uint32_t Grammar::new_rule() {
  rules_.emplace_back();
  return static_cast<uint32_t>(rules_.size() - 1);
}

void Grammar::add_alternative(uint32_t rule, const Seq& seq) {
  rules_.at(rule).push_back(static_cast<uint32_t>(elements_.size()));
  for (const Symbol& s : seq) {
    elements_.push_back({s.kind == Symbol::kBytes ? Element::kBytes : Element::kRule, s.id});
  }
  elements_.push_back({Element::kEnd, 0});
}

Symbol Grammar::rule_of(const std::vector<Seq>& alternatives) {
  const uint32_t r = new_rule();
  for (const Seq& a : alternatives) add_alternative(r, a);
  return {Symbol::kRule, r};
}

Symbol Grammar::bytes(const ByteSet& set) {
  for (size_t i = 0; i < sets_.size(); ++i) {  // few distinct sets: share them
    if (sets_[i] == set) return {Symbol::kBytes, static_cast<uint32_t>(i)};
  }
  sets_.push_back(set);
  return {Symbol::kBytes, static_cast<uint32_t>(sets_.size() - 1)};
}

Symbol Grammar::byte(uint8_t b) {
  ByteSet s;
  s.set(b);
  return bytes(s);
}

Symbol Grammar::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  for (int b = lo; b <= hi; ++b) s.set(static_cast<size_t>(b));
  return bytes(s);
}

Seq Grammar::literal(const std::string& text) {
  Seq out;
  for (char c : text) out.push_back(byte(static_cast<uint8_t>(c)));
  return out;
}

Seq Grammar::star(const Seq& x) {
  const uint32_t r = new_rule();
  add_alternative(r, x + Seq{{Symbol::kRule, r}});  // a tail call: the stacks do not grow per repetition
  add_alternative(r, {});
  return {{Symbol::kRule, r}};
}

Seq Grammar::repeat(const Seq& x, int64_t lo, int64_t hi) {
  if (lo < 0 || (hi >= 0 && hi < lo)) throw std::invalid_argument("grammar: repeat{" + std::to_string(lo) + "," + std::to_string(hi) + "}");
  Seq out;
  for (int64_t i = 0; i < lo; ++i) out = out + x;
  if (hi < 0) return out + star(x);
  Seq tail;  // (x (x ...)?)? with hi - lo copies
  for (int64_t i = lo; i < hi; ++i) tail = {rule_of({x + tail, {}})};
  return out + tail;
}

Matcher::Matcher(const Grammar& grammar) : grammar_(&grammar) {
  for (uint32_t a : grammar.alternatives(grammar.root())) normalize_into({a}, stacks_, 0);
  std::sort(stacks_.begin(), stacks_.end());
  stacks_.erase(std::unique(stacks_.begin(), stacks_.end()), stacks_.end());
}

// Expands `stack` until its top is a byte set (or it is empty): an alternative's end returns to the sequence below,
// a rule reference becomes one stack per alternative of the rule.
void Matcher::normalize_into(Stack stack, std::vector<Stack>& out, int depth) const {
  if (depth > 4096) throw std::logic_error("grammar: a rule reaches itself without consuming a byte (left recursion)");
  while (!stack.empty() && grammar_->element(stack.back()).kind == Grammar::Element::kEnd) stack.pop_back();
  if (stack.empty() || grammar_->element(stack.back()).kind == Grammar::Element::kBytes) {
    out.push_back(std::move(stack));
    return;
  }
  const uint32_t pos = stack.back();
  const uint32_t rule = grammar_->element(pos).id;
  stack.pop_back();
  if (grammar_->element(pos + 1).kind != Grammar::Element::kEnd) stack.push_back(pos + 1);  // else a tail call
  for (uint32_t a : grammar_->alternatives(rule)) {
    Stack s = stack;
    s.push_back(a);
    normalize_into(std::move(s), out, depth + 1);
  }
}

bool Matcher::accept(uint8_t byte) {
  std::vector<Stack> next;
  for (const Stack& s : stacks_) {
    if (s.empty()) continue;
    const Grammar::Element& e = grammar_->element(s.back());
    if (!grammar_->byte_set(e.id).test(byte)) continue;
    Stack t = s;
    t.back() += 1;
    normalize_into(std::move(t), next, 0);
  }
  if (next.empty()) return false;
  std::sort(next.begin(), next.end());
  next.erase(std::unique(next.begin(), next.end()), next.end());
  stacks_ = std::move(next);
  return true;
}

bool Matcher::accept(const std::string& bytes) {
  Matcher trial = *this;
  for (char c : bytes) {
    if (!trial.accept(static_cast<uint8_t>(c))) return false;
  }
  *this = std::move(trial);
  return true;
}

bool Matcher::can_end() const {
  return std::any_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

bool Matcher::finished() const {
  return std::all_of(stacks_.begin(), stacks_.end(), [](const Stack& s) { return s.empty(); });
}

ByteSet Matcher::next_bytes() const {
  ByteSet out;
  for (const Stack& s : stacks_) {
    if (!s.empty()) out |= grammar_->byte_set(grammar_->element(s.back()).id);
  }
  return out;
}

}  // namespace structured
