// Tensor parallelism inside a mixture of experts (HF transformers 5's "moe_tp_experts", with its
// "packed_colwise" gate_up_proj and "rowwise" down_proj): every rank holds a slice of every expert's
// intermediate features.
//
// Placement algebra, for the experts' 3-D parameters (transformers 5's layout):
//   gate_up_proj [E, 2I, H]  _StridedShard(1, 2): rank r holds [gate chunk r; up chunk r] of each expert, so the
//                            expert's chunk(2) still pairs its gate and up features
//   down_proj    [E, H, I]   Shard(2): the same intermediate features
// The module computes on the local shards (its routing indexes tokens, which DTensors do not follow): each
// rank's output is a partial sum over its features, all-reduced after the forward. The inputs (tokens x and
// routing weights w, the same on every rank) take an all-reduce of their gradients in backward: Megatron's
// f (identity forward, all-reduce backward) before and g (all-reduce forward, identity backward) after.
// The parameters stay DTensors with those placements (the optimizer, clipping and checkpoints see honest
// global tensors); the forward reads their local shards through the module's parameter members
// (dtensor::nn::ParameterMembers), as fully_shard does.
#pragma once

#include "dtensor/tp/style.h"

namespace dtensor {

// On a module with parameters gate_up_proj [E, 2I, H] and down_proj [E, H, I] whose forward is
// (x [T, H], expert ids [T, k], weights [T, k]) -> [T, H], and which names its members (ParameterMembers).
struct MoeTensorParallel : ParallelStyle {
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "MoeTensorParallel"; }
};

}  // namespace dtensor
