// Loss parallel (PyTorch's torch.distributed.tensor.parallel.loss_parallel): cross-entropy on logits sharded
// on the class dim (the output of a ColwiseParallel lm head with use_local_output = false), without
// gathering them. While a LossParallelGuard is alive on this thread, log_softmax over a sharded class dim
// reduces its max and sum of exponentials across ranks (two small all-reduces), and nll_loss picks each
// sample's target log-probability on the rank that owns it (one all-reduce of the per-sample values).
// Keep the guard alive through loss.backward(): the backwards need it too.
//
//   { dtensor::LossParallelGuard guard;
//     at::Tensor loss = at::cross_entropy_loss(logits /* Shard(-1) */, labels);
//     loss.backward(); }
//
// Class-index targets, ignore_index, weights, mean / sum / none reductions and label smoothing (which
// PyTorch's loss_parallel lacks) give the same forward and backward as the replicated computation.
#pragma once

namespace dtensor {

class LossParallelGuard {
 public:
  LossParallelGuard();
  ~LossParallelGuard();
  LossParallelGuard(const LossParallelGuard&) = delete;
  LossParallelGuard& operator=(const LossParallelGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

}  // namespace dtensor
