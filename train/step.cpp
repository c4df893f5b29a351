#include "train/step.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/core/error.h"
#include "dtensor/dp/clip_grad.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/mesh/comm_clock.h"
#include "dtensor/tp/loss_parallel.h"
#include "dtensor/mesh/functional_collectives.h"
#include "train/pipeline.h"

namespace train {
namespace {

int64_t sum_values(const std::map<std::string, int64_t>& m) {
  int64_t total = 0;
  for (const auto& [_, v] : m) total += v;
  return total;
}


// Gradient sync back on when the micro-batches end, however they end.
struct GradientSyncRestorer {
  llama::LlamaForCausalLM& model;
  bool active;
  ~GradientSyncRestorer() {
    if (active) dtensor::set_requires_gradient_sync(*model, true);
  }
};

// clip_grad_norm_ when each pp rank holds some of the parameters (torchtitan's clip_grad_norm_ with its pp_mesh): the
// stages' squared norms summed over the pp group, then every gradient scaled by min(1, max_norm / (norm + 1e-6)).
double clip_grad_norm_over_stages(const std::vector<at::Tensor>& params, double max_norm, const dtensor::DeviceMesh& pp) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  const double mine = dtensor::get_total_norm(grads);
  const double total = std::sqrt(
      dtensor::all_reduce(at::full({1}, mine * mine, at::kDouble), dtensor::ReduceOp::SUM, pp, 0).item<double>());
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1.0) {
    at::NoGradGuard no_grad;
    for (auto& g : grads) g.mul_(coef);
  }
  return total;
}

}  // namespace

double loss_value(const at::Tensor& t) { return (dtensor::is_dtensor(t) ? dtensor::to_local(t) : t).item<double>(); }

int64_t StepRecord::total_counts() const { return sum_values(fwd_bwd_counts) + sum_values(update_counts); }
int64_t StepRecord::total_bytes() const { return sum_values(fwd_bwd_bytes) + sum_values(update_bytes); }

at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& labels) {
  // The labels are plain and the same on every rank, as PyTorch's loss_parallel takes them. In fp32 whatever the
  // model's dtype, as transformers' ForCausalLMLoss upcasts the logits.
  return at::cross_entropy_loss(logits.flatten(0, 1).to(at::kFloat), labels.flatten(0, 1));
}

at::Tensor training_loss(llama::LlamaForCausalLM& model, const at::Tensor& inputs, const at::Tensor& labels,
                         const llama::SumOverRanks& sum_over_data_ranks, const at::Tensor& positions) {
  at::Tensor loss = next_token_loss(model(inputs, at::Tensor(), positions), labels);
  // A mixture of experts adds its routers' load-balancing loss, as transformers' causal LM loss does. The
  // routers run on plain tensors, the same on every TP rank: beside a DTensor loss (loss parallel) the term
  // is that rank's replica, so that its gradient comes back plain.
  if (model->config.moe.num_experts > 0) {
    at::Tensor aux = model->config.moe.router_aux_loss_coef * model->aux_loss({}, sum_over_data_ranks);
    if (dtensor::is_dtensor(loss)) {
      const dtensor::DeviceMesh& mesh = dtensor::device_mesh(loss);
      aux = dtensor::DTensor::from_local(aux, mesh, dtensor::Placements(mesh.ndim(), dtensor::Replicate()));
    }
    loss = loss + aux;
  }
  return loss;
}

llama::SumOverRanks sum_over_data_ranks(const models::ParallelDims& dims) {
  if (!dims.dp_enabled()) return {};
  const dtensor::DeviceMesh data_mesh = dims.data_mesh();
  // Megatron's f then g: forward one all-reduce; backward an all-reduce too (every rank's loss holds the
  // global term, and DDP then averages the gradients over the dp ranks).
  return [data_mesh](const at::Tensor& t) {
    const at::Tensor f = dtensor::to_local(dtensor::DTensor::from_local(t, data_mesh, {dtensor::Replicate()}),
                                           dtensor::Placements{dtensor::Partial()});
    return dtensor::all_reduce_autograd(f, dtensor::ReduceOp::SUM, data_mesh.get_group(0));
  };
}

double lr_at(const TrainOptions& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  const int64_t decay_steps = std::max<int64_t>(1, o.steps - o.warmup - 1);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / static_cast<double>(decay_steps));
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

void train_step(llama::LlamaForCausalLM& model, const Batch& batch, const StepContext& c, StepRecord& rec,
                const std::function<void()>& after_backward) {
  train_step(model, std::vector<Batch>{batch}, c, rec, after_backward);
}

void train_step(llama::LlamaForCausalLM& model, const std::vector<Batch>& microbatches, const StepContext& c,
                StepRecord& rec, const std::function<void()>& after_backward) {
  DTENSOR_CHECK(!microbatches.empty(), "dtensor: train_step: no micro-batch");
  for (auto& group : c.optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(rec.lr);
  const auto start = std::chrono::steady_clock::now();
  const int64_t comm_start = dtensor::exposed_comm_ns();
  c.optimizer.zero_grad();
  {
    dtensor::CommDebugMode comm;
    std::optional<dtensor::LossParallelGuard> guard;
    if (c.loss_parallel) guard.emplace();
    std::optional<dtensor::cp::ContextParallel> context_parallel;
    if (c.cp_mesh) context_parallel.emplace(*c.cp_mesh, c.cp_options);
    const auto n = static_cast<int64_t>(microbatches.size());
    const GradientSyncRestorer restore_sync{model, n > 1};
    double loss_sum = 0;
    if (c.pipeline) {
      // The step's rows as one batch again: the schedule cuts them into its own microbatches.
      std::vector<at::Tensor> inputs, labels;
      for (const Batch& b : microbatches) {
        inputs.push_back(b.inputs);
        labels.push_back(b.labels);
      }
      rec.loss = c.pipeline->forward_backward(at::cat(inputs).to(c.device), at::cat(labels).to(c.device));
      rec.pp_wait_ms = c.pipeline->last_stats().wait_ms;
    }
    for (int64_t i = 0; !c.pipeline && i < n; ++i) {
      const Batch& batch = microbatches[static_cast<size_t>(i)];
      // The gradients of every micro-batch but the last stay where backward leaves them (added up locally).
      if (n > 1) dtensor::set_requires_gradient_sync(*model, i + 1 == n);
      const at::Tensor positions = batch.positions.defined() ? batch.positions.to(c.device) : at::Tensor();
      at::Tensor loss = training_loss(model, batch.inputs.to(c.device), batch.labels.to(c.device),
                                      c.sum_over_data_ranks, positions);
      loss_sum += loss_value(loss);
      (n > 1 ? loss / static_cast<double>(n) : loss).backward();
    }
    if (!c.pipeline) rec.loss = loss_sum / static_cast<double>(n);
    rec.fwd_bwd_counts = comm.get_comm_counts();
    rec.fwd_bwd_bytes = comm.get_comm_bytes();
  }
  if (c.reduce_loss) rec.loss = c.reduce_loss(rec.loss);
  if (after_backward) after_backward();
  {
    dtensor::CommDebugMode comm;
    // Clipping needs the global norm: each DTensor gradient's norm reduces over its shards.
    rec.grad_norm = c.max_norm <= 0 ? NAN
                    : c.pipeline ? clip_grad_norm_over_stages(c.params, c.max_norm, c.pipeline->pp_mesh())
                                 : dtensor::clip_grad_norm_(c.params, c.max_norm);
    c.optimizer.step();
    rec.update_counts = comm.get_comm_counts();
    rec.update_bytes = comm.get_comm_bytes();
  }
  rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  rec.comm_ms = static_cast<double>(dtensor::exposed_comm_ns() - comm_start) / 1e6;
}

}  // namespace train
