#include "inference/serving/block_pool.h"

#include <algorithm>

namespace serve {
namespace {

// FNV-1a over the parent's hash and the block's tokens.
uint64_t block_hash(uint64_t parent, const int64_t* tokens, int64_t n) {
  uint64_t h = 1469598103934665603ULL ^ parent;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ULL;
  };
  mix(parent);
  for (int64_t i = 0; i < n; ++i) mix(static_cast<uint64_t>(tokens[i]));
  return h;
}

}  // namespace

BlockAllocator::BlockAllocator(int64_t num_blocks, bool prefix_caching)
    : total_(num_blocks), prefix_caching_(prefix_caching), refs_(num_blocks, 0), cached_(num_blocks),
      lru_at_(num_blocks) {
  // Handed out from the lowest index: a LIFO free list, so a freed block is reused first.
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int64_t> BlockAllocator::allocate() {
  int64_t b = -1;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();  // the least recently used cached block: evicted
    lru_.pop_front();
    uncache(b);
  } else {
    return std::nullopt;
  }
  refs_[b] = 1;
  return b;
}

void BlockAllocator::release(std::vector<int64_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    const int64_t b = *it;
    if (--refs_[b] > 0) continue;
    if (cached_[b]) {
      lru_at_[b] = lru_.insert(lru_.end(), b);  // most recently used last
    } else {
      free_.push_back(b);
    }
  }
  blocks.clear();
}

void BlockAllocator::release_uncached(std::vector<int64_t>& blocks) {
  for (int64_t b : blocks) {
    if (refs_[b] == 1) uncache(b);  // its last holder (every sequence of a failed step is discarded)
  }
  release(blocks);
}

void BlockAllocator::uncache(int64_t block) {
  if (!cached_[block]) return;
  auto it = by_hash_.find(cached_[block]->hash);
  if (it != by_hash_.end() && it->second == block) by_hash_.erase(it);
  cached_[block].reset();
}

std::vector<int64_t> BlockAllocator::match(const std::vector<int64_t>& tokens, int64_t block_size, int64_t max_blocks) {
  std::vector<int64_t> out;
  if (!prefix_caching_) return out;
  const int64_t full = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size);
  queried_ += full * block_size;
  uint64_t parent = 0;
  for (int64_t i = 0; i < full; ++i) {
    const int64_t* t = tokens.data() + i * block_size;
    const uint64_t h = block_hash(parent, t, block_size);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    const Cached& c = *cached_[it->second];
    if (c.parent != parent || !std::equal(c.tokens.begin(), c.tokens.end(), t)) break;
    const int64_t b = it->second;
    if (refs_[b]++ == 0) lru_.erase(lru_at_[b]);  // in use again: not evictable
    out.push_back(b);
    parent = h;
  }
  hits_ += static_cast<int64_t>(out.size()) * block_size;
  return out;
}

void BlockAllocator::cache(const std::vector<int64_t>& tokens, const std::vector<int64_t>& blocks, int64_t block_size,
                           int64_t computed) {
  if (!prefix_caching_) return;
  const int64_t full = std::min<int64_t>(computed / block_size, static_cast<int64_t>(blocks.size()));
  uint64_t parent = 0;
  for (int64_t i = 0; i < full; ++i) {
    const int64_t* t = tokens.data() + i * block_size;
    const uint64_t h = block_hash(parent, t, block_size);
    const int64_t b = blocks[i];
    if (!cached_[b] && !by_hash_.contains(h)) {  // the first block to hold these tokens is the one found
      cached_[b] = Cached{h, parent, std::vector<int64_t>(t, t + block_size)};
      by_hash_[h] = b;
    }
    parent = h;
  }
}

}  // namespace serve
