// HeadReplicatedColwiseParallel: ColwiseParallel for a key/value projection of grouped-query attention
// when the TP degree may exceed the number of key/value heads (Megatron's and vLLM's answer).
//
//   heads % tp == 0   exactly ColwiseParallel: weight Shard(0), each rank owns heads / tp whole heads.
//   tp % heads == 0   each head is replicated on the tp / heads ranks that share it. Weight (and bias)
//                     Replicate; input -> Replicate. Every rank computes x @ W^T (all heads: the k/v
//                     projections are the small ones, heads * head_dim columns), repeats each head tp / heads
//                     times (Replicate [.., tp * head_dim]) and keeps its chunk (Replicate -> Shard(-1), no
//                     comm): rank r holds head h(r) = r / (tp / heads), and global k/v have tp heads, one per
//                     rank, so the model's n_rep = q heads / k heads pairs rank r's query heads with h(r), as in
//                     the unsharded model.
//                     Backward: Shard(-1) -> Replicate (an all-gather of b·s·tp·head_dim), and the repeat's
//                     backward sums each head's copies: the weight gradient is Replicate and exact.
//                     (A cheaper variant would skip that all-gather by taking the gradient back as Partial.)
//   otherwise         a dtensor::Error at plan time (validate) naming the module, heads and the TP degree.
#pragma once

#include <cstdint>
#include <utility>

#include "dtensor/tp/style.h"

namespace dtensor {

struct HeadReplicatedColwiseParallelOptions {
  int64_t num_heads = 1;  // heads of the projection's output (key/value heads)
  int64_t head_dim = 1;   // output features = num_heads * head_dim
  bool use_local_output = false;
};

// The TP degree is the mesh's size: parallelize_module checks it against num_heads (validate_mesh) before it
// applies any entry of the plan.
struct HeadReplicatedColwiseParallel : ParallelStyle, HeadReplicatedColwiseParallelOptions {
  HeadReplicatedColwiseParallel(HeadReplicatedColwiseParallelOptions options = {})
      : HeadReplicatedColwiseParallelOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void validate_mesh(const std::string& path, const DeviceMesh& mesh) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "HeadReplicatedColwiseParallel"; }
};

}  // namespace dtensor
