// The paged KV cache's blocks on rank 0, with automatic prefix caching (vLLM's BlockPool and APC).
//
// Blocks are reference-counted. A full block of a sequence's tokens whose keys and values are written is cached
// under the hash chain of its tokens: h_i = hash(h_{i-1}, tokens of block i), h_{-1} = 0, so a block is found only
// after the same tokens in every block before it. A sequence admitted later takes the longest run of cached blocks
// that begins its tokens (match) and computes only what follows; n samples of one prompt and requests sharing a
// system prompt share those blocks. A released block whose count falls to 0 stays cached, evictable: allocate()
// takes never-cached free blocks first, then evicts the least recently used cached one. A match checks each
// block's own tokens as well as the hash (vLLM's default hash is not collision-checked; ours compares the tokens
// of the block, and the chain's 64-bit hash for what precedes it).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

namespace serve {

class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks, bool prefix_caching = false);
  // A block with a count of 1: a never-cached free one, else the least recently used cached block (evicted).
  std::optional<int64_t> allocate();
  // Drops one reference to each of `blocks` (and empties it); cached blocks stay findable until evicted.
  void release(std::vector<int64_t>& blocks);
  // As release, after a step that failed: the blocks are forgotten by the prefix cache first (the step was to write
  // their keys and values and may not have).
  void release_uncached(std::vector<int64_t>& blocks);
  // Prefix caching: the longest run of cached blocks holding tokens[0, k * block_size), k <= max_blocks, each with
  // one more reference. Counts the tokens asked for (up to max_blocks' worth) and those found.
  std::vector<int64_t> match(const std::vector<int64_t>& tokens, int64_t block_size, int64_t max_blocks);
  // `blocks` hold `tokens`' keys and values up to `computed` positions: caches every full block among them.
  void cache(const std::vector<int64_t>& tokens, const std::vector<int64_t>& blocks, int64_t block_size, int64_t computed);

  bool prefix_caching() const { return prefix_caching_; }
  int64_t free() const { return static_cast<int64_t>(free_.size() + lru_.size()); }  // allocatable now
  int64_t total() const { return total_; }
  int64_t used() const { return total_ - free(); }
  int64_t cached() const { return static_cast<int64_t>(by_hash_.size()); }
  int64_t queried_tokens() const { return queried_; }
  int64_t hit_tokens() const { return hits_; }

 private:
  struct Cached {
    uint64_t hash = 0, parent = 0;
    std::vector<int64_t> tokens;
  };
  void uncache(int64_t block);

  int64_t total_;
  bool prefix_caching_;
  std::vector<int64_t> refs_;
  std::vector<std::optional<Cached>> cached_;      // by block
  std::unordered_map<uint64_t, int64_t> by_hash_;  // hash -> block
  std::vector<int64_t> free_;                      // count 0, not cached (LIFO)
  std::list<int64_t> lru_;                         // count 0, cached: least recently used first
  std::vector<std::list<int64_t>::iterator> lru_at_;
  int64_t queried_ = 0, hits_ = 0;
};

}  // namespace serve
