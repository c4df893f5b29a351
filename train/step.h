// One training step (torchtitan's Trainer.train_step): forward and loss, backward, gradient clipping and the
// optimizer step, with the step's collectives counted by phase. The loop (loop.h) calls it once per batch.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>

#include "dtensor/cp/context_parallel.h"
#include <map>
#include <string>
#include <vector>

#include "common/parallel_dims.h"
#include "llama/model.h"
#include "train/data.h"
#include "train/options.h"

namespace train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0, ms = 0;
  double comm_ms = 0;  // exposed communication: this rank's main thread inside collectives (comm_clock.h)
  double pp_wait_ms = 0;  // pipeline parallel: this rank blocked in the schedule's receives (its bubble, measured)
  int64_t microbatches = 1;  // gradient accumulation: micro-batches in this step
  double eval_loss = NAN;    // the held-out split's mean loss after this step (eval.h); NaN: not evaluated
  int64_t eval_tokens = 0;
  std::map<std::string, int64_t> fwd_bwd_counts, fwd_bwd_bytes;  // forward + backward, by collective
  std::map<std::string, int64_t> update_counts, update_bytes;    // grad clipping + optimizer step
  int64_t total_counts() const;
  int64_t total_bytes() const;
};

// A loss's value on this rank (a DTensor loss, loss parallel's, through its local tensor).
double loss_value(const at::Tensor& loss);

// Mean next-token cross-entropy of logits [b, s, vocab] against labels [b, s]. With loss parallel the logits
// are Shard(-1) (vocab) and a LossParallelGuard makes log_softmax / nll_loss reduce across ranks instead of
// gathering the logits.
at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& labels);

// The training loss of `model` on `inputs`: the next-token cross-entropy, plus a mixture of experts'
// router_aux_loss_coef * load-balancing loss (its statistics pooled by sum_over_data_ranks when given).
at::Tensor training_loss(llama::LlamaForCausalLM& model, const at::Tensor& inputs, const at::Tensor& labels,
                         const llama::SumOverRanks& sum_over_data_ranks = {}, const at::Tensor& positions = {});
// The load-balancing statistics' sum over the dp ranks of `dims` (empty at dp 1).
llama::SumOverRanks sum_over_data_ranks(const models::ParallelDims& dims);

// The learning rate of step `step` (0-based): linear warmup over `warmup` steps to `lr`, then cosine decay
// to lr / 10 at the last step.
double lr_at(const TrainOptions& options, int64_t step);

// What a step needs besides the model: the optimizer over `params` (each parameter once), whether the logits
// come vocab-sharded (loss parallel), and the device of the batches.
class Pipeline;  // train/pipeline.h

struct StepContext {
  torch::optim::AdamW& optimizer;
  const std::vector<at::Tensor>& params;
  bool loss_parallel = false;
  c10::Device device = c10::kCPU;
  double max_norm = 1.0;  // <= 0: no clipping (grad_norm NaN)
  // This rank's loss to the reported one (data parallel: the mean over the dp ranks); empty: as it is.
  // Outside the counted collectives, inside the step's time.
  std::function<double(double)> reduce_loss = {};
  // A mixture of experts' load-balancing statistics summed over the dp ranks (llama::load_balancing_loss),
  // so that the loss is the global batch's; empty: this rank's rows alone.
  llama::SumOverRanks sum_over_data_ranks = {};
  // Context parallel: the forward's attention is ring attention over this mesh (dtensor/cp/context_parallel.h).
  std::optional<dtensor::DeviceMesh> cp_mesh = std::nullopt;
  dtensor::cp::RingAttentionOptions cp_options = {};
  // Pipeline parallel (--pp): the step's rows go through this rank's stage by the schedule (train/pipeline.h) instead
  // of the model's forward; clipping takes the norm over every stage's gradients.
  Pipeline* pipeline = nullptr;
};

// Runs one step on `batch` (this rank's rows) at learning rate rec.lr and fills rec's loss (reduce_loss of this
// rank's rows' mean), grad_norm, ms, comm_ms and collectives. `after_backward` (may be empty) runs between backward and
// clipping.
void train_step(llama::LlamaForCausalLM& model, const Batch& batch, const StepContext& context, StepRecord& rec,
                const std::function<void()>& after_backward = {});
// Gradient accumulation (torchtitan's gradient_accumulation_steps): one optimizer step over `microbatches` (this
// rank's rows of each, equal sizes). Each micro-batch's loss is divided by their number before its backward, so the
// gradients add up to the mean over all their tokens, as one batch of them all; gradient sync is off for all but the
// last backward (dtensor::set_requires_gradient_sync: DDP's buckets, FSDP's reduce-scatters and TP's Partial
// gradients are reduced once per step, not per micro-batch). rec.loss is the micro-batches' mean.
void train_step(llama::LlamaForCausalLM& model, const std::vector<Batch>& microbatches, const StepContext& context,
                StepRecord& rec, const std::function<void()>& after_backward = {});

}  // namespace train
