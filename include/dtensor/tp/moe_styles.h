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

#include <string>
#include <vector>

#include "dtensor/tp/style.h"

namespace dtensor {

// On a module with parameters gate_up_proj [E, 2I, H] and down_proj [E, H, I] whose forward is
// (x [T, H], expert ids [T, k], weights [T, k]) -> [T, H], and which names its members (ParameterMembers).
struct MoeTensorParallel : ParallelStyle {
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "MoeTensorParallel"; }
};

// Expert parallelism (torchtitan's ExpertParallel / ExpertTensorParallel, Megatron's EP): the experts are
// split whole across the "ep" ranks, and each token travels to the rank that holds its expert and back.
//
// Placement algebra, on a 1-D ("ep") mesh, or a 2-D ("ep", "tp") mesh (TP inside each expert, as above):
//   gate_up_proj [E, 2I, H]  (Shard(0)[, _StridedShard(1, 2)]): rank e holds experts [e·E/ep, (e+1)·E/ep)
//   down_proj    [E, H, I]   (Shard(0)[, Shard(2)])
// The ep ranks hold different tokens (EP borrows data-parallel ranks, as torchtitan's does). Around the
// module's forward (x [T, H], expert ids [T, k], weights [T, k]):
//   dispatch  the T·k (token, slot) rows sorted by expert, so by owning rank; the rows per expert exchanged
//             (all_to_all of E counts); the rows themselves sent by an all_to_all of uneven splits: each rank
//             receives its experts' rows from every rank, grouped by source, then by local expert;
//   compute   the module's own forward on its local experts (expert ids local, weights 1: one grouped matmul
//             per local expert); under TP a partial sum over the expert's features, all-reduced over "tp";
//   combine   the reverse all_to_all brings each row home; weighted by its routing weight and summed over
//             the k slots, in the same order as the module's own path.
// Backward runs the conjugates (each all_to_all's gradient is the all_to_all with the splits swapped). A
// meta tensor carries no routing: the dry run assumes balanced routing (rows evenly over experts).
struct ExpertParallelOptions {
  // The tokens are the same on every rank (generation with a replicated batch): nothing is dispatched. Each
  // rank computes the (token, slot) pairs of its own experts, and one all-reduce of [T, H] (over "ep", and
  // "tp") sums the ranks' partial outputs (as transformers 5's expert parallel does). Per block: 1 collective
  // instead of 3 all_to_alls, and no expert computed twice.
  bool replicated_tokens = false;
};

struct ExpertParallel : ParallelStyle, ExpertParallelOptions {
  ExpertParallel(ExpertParallelOptions options = {}) : ExpertParallelOptions(options) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void validate_mesh(const std::string&, const DeviceMesh&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "ExpertParallel"; }
};

// ExpertParallel on every module of `root` that `keys` match (parallelize_module's key syntax), over the 1-D
// ("ep") or 2-D ("ep", "tp") `mesh`; then the hooks are linked and gradient sync installed, as
// parallelize_module does. Validates every match first: a bad key or mesh leaves `root` untouched.
void parallelize_experts(torch::nn::Module& root, const DeviceMesh& mesh, const std::vector<std::string>& keys,
                         ExpertParallelOptions options = {});

}  // namespace dtensor
