// Redistribution to and from _StridedShard placements (placement.h): the naive path, always.
//
// A _StridedShard's shards are not the nested torch.chunk pieces the planner's all-gathers and
// reduce-scatters assume (nor always boxes: shard_layout.h's runs), so a spec with one is redistributed by
// materialising the full value and cutting the target's shard out of it:
//   Partial dims   all-reduce first (the shards along a Partial mesh dim share one geometry);
//   shards         the shards along this rank's Shard mesh dims gathered whole (one all-gather per Shard
//                  mesh dim of the flattened, padded shards; along a Replicate dim each rank keeps its own
//                  copy), then written to their runs (shard_runs, which knows the strided order).
// FSDP never takes this path in a training step (it gathers and reduce-scatters its flat buffers over dp
// itself); full_tensor, distribute_tensor's checks and checkpoints do.
#pragma once

#include <ATen/core/Tensor.h>

#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor::detail {

// The full value of the DTensor of spec `spec` whose local shard here is `local`, on every rank.
at::Tensor gather_full_value(const at::Tensor& local, const DTensorSpec& spec);
// This rank's shard of `dst` (which may hold _StridedShard) from its shard `local` of `src`.
at::Tensor redistribute_local_strided(const at::Tensor& local, const DTensorSpec& src, const Placements& dst);

}  // namespace dtensor::detail
