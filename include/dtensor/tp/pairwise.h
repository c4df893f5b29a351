// PairwiseParallel: the RFC's one style for a whole block (PyTorch 2.0-2.2's, since removed there):
// Megatron's pairing of a ColwiseParallel Linear with the RowwiseParallel Linear after it, Replicate in and
// Replicate out, so that a block costs one all-reduce forward (and one backward). It walks the module it is
// applied to:
//   MultiheadAttention  heads split across ranks (num_heads % tp == 0). The packed in_proj_weight [3E, E] is
//                       [Q; K; V], each H heads of head_dim rows: _StridedShard(0, 3) gives rank r the r-th
//                       slice of each of the three, i.e. its heads' q, k and v rows; in_proj_bias the same;
//                       separate q/k/v_proj_weight (kdim / vdim != E) Shard(0); bias_k / bias_v Shard(2);
//                       out_proj Rowwise (weight Shard(1): its heads' columns; bias Replicate).
//   >= 2 Linear children  (a Sequential MLP, TransformerEncoderLayer's linear1 / linear2, a block of yours):
//                       Linear 0, 2, 4, ... Colwise and 1, 3, 5, ... Rowwise, in registration order; with an
//                       odd count the last one stays replicated (a warning, as PyTorch's did).
//   other children      each in turn (Transformer, TransformerEncoder / Decoder, their ModuleLists, layers).
// Every parameter left (LayerNorms, embeddings, an odd last Linear) becomes a Replicate DTensor. A module in
// which it finds nothing to pair is refused. On LibTorch's own layers (no hooks) the model's inputs and
// outputs are converted by Parallelized (parallelized.h); on dtensor::nn layers the styles' hooks do it.
#pragma once

#include "dtensor/tp/style.h"

namespace dtensor {

struct PairwiseParallel : ParallelStyle {
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PairwiseParallel"; }
};

}  // namespace dtensor
