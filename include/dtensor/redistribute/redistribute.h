// Redistribution of a local shard between two specs on the same mesh: the planner, the plan's steps, and a
// naive reference path. No autograd here: dtensor::redistribute (tensor/dtensor.h) wraps this.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor {

// One step of a plan, on one mesh dim.
struct TransformStep {
  enum class Kind {
    ALL_GATHER,      // Shard(d) -> Replicate
    ALL_REDUCE,      // Partial -> Replicate
    REDUCE_SCATTER,  // Partial -> Shard(d)
    ALL_TO_ALL,      // Shard(d) -> Shard(e)
    CHUNK,           // Replicate -> Shard(d), local
    PARTITION,       // Replicate -> Partial, local
    PAD_PARTIAL,     // Shard(d) -> Partial(sum|avg), local: the shard in zeros of the full extent
  };
  Kind kind;
  int64_t mesh_dim;
  Placement from;
  Placement to;
  std::string to_string() const;  // "mesh dim 0: all_gather Shard(dim=0) -> Replicate()"
};

// The steps that take `src` to `dst` placements (same mesh and tensor). Reductions happen while the
// tensor is still as sharded as it can be; un-sharding runs from the innermost mesh dim outwards and
// sharding from the outermost inwards, which keeps the nesting order of mesh dims that shard one tensor
// dim. Pure: depends only on the specs, cached.
std::vector<TransformStep> plan_redistribute(const DTensorSpec& src, const Placements& dst);

// Applies the plan to this rank's shard of `src` and returns its shard of the result.
at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src, const Placements& dst);

// Reference path: materialise the full value on every rank (all-gather every shard, all-reduce every
// Partial), then cut this rank's shard of `dst` out of it. Obviously correct, maximally expensive; used
// by the tests to check the planner.
at::Tensor redistribute_local_naive(const at::Tensor& local, const DTensorSpec& src, const Placements& dst);

// Replicate -> Partial(op) on one mesh dim: the term this rank holds so that op over the ranks gives
// `value` back: value / n for sum (as PyTorch), value itself for avg, max and min.
at::Tensor partition_value(const at::Tensor& value, ReduceOp op, int64_t mesh_coordinate, int64_t mesh_size);

}  // namespace dtensor
