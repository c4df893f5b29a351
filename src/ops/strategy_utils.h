// Small tools the strategy files share: per-mesh-dim candidate choice by cost, dim bookkeeping.
// Internal header.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "ops/op_call.h"
#include "ops/op_table.h"
#include "ops/run_strategy.h"

namespace dtensor::ops {

// Bytes of tensor `t` (global).
int64_t global_bytes(const at::Tensor& t);

// Cost of moving one mesh dim of an input from `from` to `to` (bytes, 0 when free).
int64_t placement_cost(const Placement& from, const Placement& to, int64_t bytes, int64_t mesh_size);

// One candidate for a mesh dim: the placement each OpCall tensor must have there (nullopt for plain
// tensors), and the placement of each output.
struct DimCandidate {
  std::vector<std::optional<Placement>> inputs;
  std::vector<Placement> outputs;
};

// Chooses, independently for every mesh dim, the cheapest candidate `candidates_for(mesh_dim)` offers
// (the first among equals), and assembles the decision.
ShardingDecision choose_per_mesh_dim(const OpCall& call, size_t num_outputs,
                                     const std::function<std::vector<DimCandidate>(int64_t mesh_dim)>& candidates_for);

// A decision that leaves every input as it is on shard/replicate dims but reduces Partials, with the
// given output placements. Convenience for single-candidate strategies.
ShardingDecision make_decision(const OpCall& call, std::vector<std::optional<Placements>> inputs,
                               std::vector<Placements> outputs);

int64_t normalize_dim(int64_t dim, int64_t ndim);

// Ops that need tensor dim `dim` of every tensor input whole (a Shard of it gathered first); other shards are
// renumbered by `map_dim` (a _StridedShard keeps its split factor). -1: no dim needs to be whole.
ShardingDecision needs_dim_whole(const OpCall& call, int64_t dim, size_t num_outputs,
                                 const std::function<int64_t(int64_t)>& map_dim);

// This rank's shape of a tensor of global `shape` under `placements` (a size argument made local).
std::vector<int64_t> local_shape_of(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& p);

}  // namespace dtensor::ops
