// User-facing controls of the DTensor op dispatcher.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {

// While alive (on this thread), plain tensors mixed with DTensors in an op are treated as replicated on the
// DTensor's mesh instead of raising PyTorch's "mixed Tensor and DTensor" error (PyTorch's
// implicit_replication()). Plain 0-d tensors are always treated as replicated scalars.
class ImplicitReplicationGuard {
 public:
  ImplicitReplicationGuard();
  ~ImplicitReplicationGuard();
  ImplicitReplicationGuard(const ImplicitReplicationGuard&) = delete;
  ImplicitReplicationGuard& operator=(const ImplicitReplicationGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

// Seeds the random ops on DTensors (dropout, bernoulli_, uniform_, normal_) on this thread's ranks. All
// ranks must use the same seed: a random op draws the global tensor's values from one stream, so replicas
// get the same values and shards get disjoint parts of it.
void manual_seed(uint64_t seed);

// Counters of the op dispatcher on this thread: a steady-state training step only hits the cache.
struct DispatchStats {
  int64_t cache_hits = 0;    // decisions reused
  int64_t cache_misses = 0;  // strategy searches (and meta shape runs)
  int64_t calls() const { return cache_hits + cache_misses; }  // DTensor operator calls decided
};
DispatchStats& dispatch_stats();

// The operators that accept DTensors ("aten::mm", ...), sorted.
std::vector<std::string> supported_ops();

}  // namespace dtensor
