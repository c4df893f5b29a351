#include "inference/structured/token_mask.h"

#include <algorithm>
#include <map>

namespace structured {

TokenMask::TokenMask(const std::vector<std::optional<std::string>>& bytes, std::vector<int64_t> stop_ids)
    : bytes_(bytes), stop_ids_(std::move(stop_ids)) {
  // Built with a child map per node, then flattened in depth-first order (a walk reads memory mostly forward).
  struct Node {
    std::map<uint8_t, uint32_t> children;
    std::vector<int64_t> ids;
  };
  std::vector<Node> nodes(1);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (is_stop(static_cast<int64_t>(id)) || !bytes_[id] || bytes_[id]->empty()) continue;
    uint32_t node = 0;
    for (char c : *bytes_[id]) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto it = nodes[node].children.find(b);
      if (it == nodes[node].children.end()) {
        const uint32_t child = static_cast<uint32_t>(nodes.size());
        nodes[node].children.emplace(b, child);
        nodes.emplace_back();
        node = child;
      } else {
        node = it->second;
      }
    }
    nodes[node].ids.push_back(static_cast<int64_t>(id));
  }
  std::vector<uint32_t> order;  // old ids in depth-first preorder
  std::vector<uint32_t> renamed(nodes.size());
  std::vector<uint32_t> todo{0};
  while (!todo.empty()) {
    const uint32_t n = todo.back();
    todo.pop_back();
    renamed[n] = static_cast<uint32_t>(order.size());
    order.push_back(n);
    for (auto it = nodes[n].children.rbegin(); it != nodes[n].children.rend(); ++it) todo.push_back(it->second);
  }
  for (uint32_t n : order) {
    edge_begin_.push_back(static_cast<uint32_t>(edges_.size()));
    id_begin_.push_back(static_cast<uint32_t>(ids_.size()));
    for (const auto& [b, child] : nodes[n].children) edges_.push_back({b, renamed[child]});
    ids_.insert(ids_.end(), nodes[n].ids.begin(), nodes[n].ids.end());
  }
  edge_begin_.push_back(static_cast<uint32_t>(edges_.size()));
  id_begin_.push_back(static_cast<uint32_t>(ids_.size()));
}

void TokenMask::mark(uint32_t node, std::vector<uint8_t>& out) const {
  for (uint32_t i = id_begin_[node]; i < id_begin_[node + 1]; ++i) out[static_cast<size_t>(ids_[i])] = 1;
}

bool TokenMask::is_stop(int64_t id) const { return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end(); }

int32_t GrammarStates::intern(const Matcher& m) {
  auto it = index_.find(m.stacks());
  if (it != index_.end()) return it->second;
  if (states_.size() >= max_states_) return kFull;
  State s{m, m.can_end(), {}};
  s.next.fill(-2);
  states_.push_back(std::move(s));
  const int32_t id = static_cast<int32_t>(states_.size() - 1);
  index_.emplace(m.stacks(), id);
  return id;
}

int32_t GrammarStates::step(int32_t state, uint8_t byte) {
  const int32_t next = states_[static_cast<size_t>(state)].next[byte];
  if (next != -2) return next;
  Matcher m = states_[static_cast<size_t>(state)].matcher;
  const int32_t found = m.accept(byte) ? intern(m) : -1;
  if (found != kFull) states_[static_cast<size_t>(state)].next[byte] = found;  // (states_ may have grown: index again)
  return found;
}

void GrammarStates::start_walk() {
  if (states_.size() < max_states_) return;
  states_.clear();  // between walks only: no id is held
  index_.clear();
  masks_.clear();
}

void TokenMask::walk(uint32_t node, GrammarStates& states, int32_t state, std::vector<uint8_t>& out) const {
  for (uint32_t e = edge_begin_[node]; e < edge_begin_[node + 1]; ++e) {
    const auto [b, child] = edges_[e];
    const int32_t after = states.step(state, b);
    if (after == -1) continue;  // refused: the whole subtree goes
    if (after == GrammarStates::kFull) {  // the table is full: this subtree through the matcher itself
      Matcher m = states.matcher(state);
      m.accept(b);
      mark(child, out);
      walk_matcher(child, m, out);
      continue;
    }
    mark(child, out);
    if (edge_begin_[child] != edge_begin_[child + 1]) walk(child, states, after, out);
  }
}

void TokenMask::walk_matcher(uint32_t node, const Matcher& m, std::vector<uint8_t>& out) const {
  const ByteSet next = m.next_bytes();
  for (uint32_t e = edge_begin_[node]; e < edge_begin_[node + 1]; ++e) {
    const auto [b, child] = edges_[e];
    if (!next.test(b)) continue;
    Matcher after = m;
    if (!after.accept(b)) continue;
    mark(child, out);
    walk_matcher(child, after, out);
  }
}

std::vector<uint8_t> TokenMask::allowed(GrammarStates& states, const Matcher& m) const {
  states.start_walk();
  const int32_t start = states.intern(m);  // not kFull: the table has room after start_walk
  for (const auto& [s, mask] : states.masks_) {
    if (s == start) return mask;
  }
  std::vector<uint8_t> out(bytes_.size(), 0);
  walk(0, states, start, out);
  if (m.can_end()) {
    for (int64_t id : stop_ids_) {
      if (id >= 0 && id < vocab_size()) out[static_cast<size_t>(id)] = 1;
    }
  }
  if (states.masks_.size() >= 4) states.masks_.erase(states.masks_.begin());
  states.masks_.emplace_back(start, out);
  return out;
}

std::vector<uint8_t> TokenMask::allowed_naive(const Matcher& m) const {
  std::vector<uint8_t> out(bytes_.size(), 0);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (is_stop(static_cast<int64_t>(id))) {
      out[id] = m.can_end();
      continue;
    }
    if (!bytes_[id] || bytes_[id]->empty()) continue;
    Matcher trial = m;
    out[id] = trial.accept(*bytes_[id]);
  }
  return out;
}

}  // namespace structured
