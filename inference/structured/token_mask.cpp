#include "inference/structured/token_mask.h"

#include <algorithm>

namespace structured {

TokenMask::TokenMask(const std::vector<std::optional<std::string>>& bytes, std::vector<int64_t> stop_ids)
    : bytes_(bytes), stop_ids_(std::move(stop_ids)), nodes_(1) {
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (is_stop(static_cast<int64_t>(id))) continue;
    if (!bytes_[id] || bytes_[id]->empty()) continue;
    uint32_t node = 0;
    for (char c : *bytes_[id]) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto& kids = nodes_[node].children;
      auto it = std::find_if(kids.begin(), kids.end(), [&](const auto& k) { return k.first == b; });
      if (it != kids.end()) {
        node = it->second;
        continue;
      }
      const uint32_t child = static_cast<uint32_t>(nodes_.size());
      kids.emplace_back(b, child);  // (kids may move when nodes_ grows: done with it first)
      nodes_.emplace_back();
      node = child;
    }
    nodes_[node].ids.push_back(static_cast<int64_t>(id));
  }
}

bool TokenMask::is_stop(int64_t id) const { return std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end(); }

void TokenMask::walk(uint32_t node, const Matcher& m, std::vector<uint8_t>& out) const {
  const ByteSet next = m.next_bytes();
  for (const auto& [b, child] : nodes_[node].children) {
    if (!next.test(b)) continue;  // refused: the whole subtree goes, with no copy of the matcher
    Matcher after = m;
    if (!after.accept(b)) continue;
    for (int64_t id : nodes_[child].ids) out[static_cast<size_t>(id)] = 1;
    if (!nodes_[child].children.empty()) walk(child, after, out);
  }
}

std::vector<uint8_t> TokenMask::allowed(const Matcher& m) const {
  std::vector<uint8_t> out(bytes_.size(), 0);
  walk(0, m, out);
  if (m.can_end()) {
    for (int64_t id : stop_ids_) {
      if (id >= 0 && id < vocab_size()) out[static_cast<size_t>(id)] = 1;
    }
  }
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
