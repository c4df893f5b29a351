// The per-thread (so per-rank) cache of sharding decisions, keyed by (op, each tensor input's dtype, shape,
// mesh and placements, the non-tensor arguments). A steady-state training step only hits it: no strategy
// search, no meta run. Bounded (cleared when full), emptied when any rule is replaced (rules_generation),
// and it holds no DeviceMesh: output specs are built from the live input's mesh, so a mesh and its process
// groups are released when the user drops them. Internal header.
#pragma once

#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "dtensor/ops/sharding_strategy.h"
#include "ops/output_meta.h"

namespace dtensor::ops {

struct CachedDecision {
  ShardingDecision decision;
  std::vector<OutputMeta> outputs;  // global meta of each output tensor
  bool from_locals = false;         // no meta kernel: `outputs` is learnt from the first local run
};

class DecisionCache {
 public:
  static constexpr size_t kMaxEntries = 4096;

  // The cache of this thread.
  static DecisionCache& local();

  // Builds the key of `call` into an internal buffer; false when an argument cannot be keyed (the call is
  // then decided afresh every time).
  bool key(const OpCall& call);
  // The entry for the last key() (null on a miss).
  CachedDecision* find();
  // Stores `entry` under the last key() and returns it.
  CachedDecision* insert(CachedDecision entry);

 private:
  struct KeyHash {
    size_t operator()(const std::vector<int64_t>& k) const;
  };
  std::vector<int64_t> key_;
  std::unordered_map<std::vector<int64_t>, CachedDecision, KeyHash> entries_;
  uint64_t generation_ = 0;
};

}  // namespace dtensor::ops
