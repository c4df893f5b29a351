// HeadReplicatedColwiseParallel: ColwiseParallel for a key/value projection of grouped-query attention
// when the TP degree may exceed the number of key/value heads (Megatron's and vLLM's answer).
//
//   heads % tp == 0   exactly ColwiseParallel: weight Shard(0), each rank owns heads / tp whole heads.
//   tp % heads == 0   each head is replicated on the tp / heads ranks that share it. Weight (and bias)
//                     Replicate; input -> Replicate. Rank r computes x @ W^T (all heads: the k/v
//                     projections are the small ones, heads * head_dim columns) and keeps the columns of
//                     its head h(r) = r / (tp / heads). The output is a Shard(-1) DTensor of the
//                     head-repeated tensor [.., tp * head_dim] (global k/v have tp heads, one per rank), so
//                     the model's n_rep = q heads / k heads pairs rank r's query heads with h(r), as in the
//                     unsharded model.
//                     Backward: rank r's gradient of the projection output is nonzero only on h(r)'s columns;
//                     the true gradient is the sum of the ranks' terms, so it is taken back as Partial(sum)
//                     (to_local with grad_placements Partial). The weight gradient is then Partial and its
//                     Partial -> Replicate all-reduce adds the contributions of the ranks sharing each head.
//   otherwise         a dtensor::Error at plan time (validate) naming the module, heads and the TP degree.
#pragma once

#include <cstdint>

#include "dtensor/parallel/style.h"

namespace dtensor {

struct HeadReplicatedColwiseParallel : ParallelStyle {
  int64_t num_heads = 1;   // heads of the projection's output (key/value heads)
  int64_t head_dim = 1;    // output features = num_heads * head_dim
  int64_t tp_degree = 0;   // for validate (the mesh is not known there); 0: checked at apply only
  bool use_local_output = false;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "HeadReplicatedColwiseParallel"; }

 private:
  void check_degree(const std::string& path, int64_t tp) const;
};

}  // namespace dtensor
