#include "trainer.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include "dtensor/parallel/clip_grad.h"
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cmath>
#include <fstream>

#include "dtensor/error.h"
#include "dtensor/mesh/comm_clock.h"
#include "dtensor/parallel/comm_debug_mode.h"
#include "dtensor/parallel/gradient_sync.h"
#include "dtensor/parallel/loss_parallel.h"
#include "dtensor/parallel/replicate.h"
#include "dtensor/mesh/functional_collectives.h"
#include "checkpointing.h"
#include "dtensor/tensor/dtensor.h"
#include "llama/parallelize.h"

namespace llama_train {
namespace {

int64_t sum_values(const std::map<std::string, int64_t>& m) {
  int64_t total = 0;
  for (const auto& [_, v] : m) total += v;
  return total;
}

double scalar(const at::Tensor& t) { return (dtensor::is_dtensor(t) ? dtensor::to_local(t) : t).item<double>(); }


}  // namespace

at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& labels) {
  // The labels are plain and the same on every rank, as PyTorch's loss_parallel takes them.
  return at::cross_entropy_loss(logits.flatten(0, 1), labels.flatten(0, 1));
}

int64_t StepRecord::total_counts() const { return sum_values(fwd_bwd_counts) + sum_values(update_counts); }
int64_t StepRecord::total_bytes() const { return sum_values(fwd_bwd_bytes) + sum_values(update_bytes); }

double lr_at(const TrainOptions& o, int64_t step) {
  if (step < o.warmup) return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup);
  const int64_t decay_steps = std::max<int64_t>(1, o.steps - o.warmup - 1);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup) / static_cast<double>(decay_steps));
  return o.lr * (0.1 + 0.9 * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

int64_t local_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  const at::Tensor local = dtensor::is_dtensor(t) ? dtensor::to_local(t) : t;
  return local.numel() * static_cast<int64_t>(local.element_size());
}

int64_t local_param_bytes(llama::LlamaForCausalLM& model) {
  int64_t bytes = 0;
  for (const auto& p : model->parameters(/*recurse=*/true)) {
    const at::Tensor local = dtensor::is_dtensor(p) ? dtensor::to_local(p) : p;
    bytes += local.numel() * static_cast<int64_t>(local.element_size());
  }
  return bytes;
}

llama::LlamaForCausalLM make_model(const TrainOptions& o) {
  llama::LlamaForCausalLM model(o.model);
  model->init_weights(o.seed);
  return model;
}

dtensor::DeviceMesh make_mesh(const TrainOptions& o, int64_t world_size) {
  if (o.dp == 1) return dtensor::init_device_mesh(o.device, {world_size}, {"tp"});
  return dtensor::init_device_mesh(o.device, {o.dp, world_size / o.dp}, {"dp", "tp"});
}

dtensor::DeviceMesh tp_mesh_of(const dtensor::DeviceMesh& mesh) { return mesh.ndim() == 1 ? mesh : mesh["tp"]; }
int64_t dp_size_of(const dtensor::DeviceMesh& mesh) { return mesh.ndim() == 1 ? 1 : mesh.size("dp"); }

void parallelize(llama::LlamaForCausalLM& model, const TrainOptions& o, const dtensor::DeviceMesh& mesh) {
  const dtensor::DeviceMesh tp_mesh = tp_mesh_of(mesh);
  if (tp_mesh.size() > 1) {
    if (o.plan == "hf") {
      llama::apply_hf_tp(model, tp_mesh);
    } else {
      llama::apply_tp(model, tp_mesh, {.sequence_parallel = o.sequence_parallel, .loss_parallel = o.loss_parallel, .async_tp = o.async_tp});
    }
    if (!o.gradient_sync) dtensor::disable_gradient_sync(*model);
  }
  if (dp_size_of(mesh) == 1) return;
  if (o.data_parallel == "ddp") {
    dtensor::replicate(*model, mesh);
  } else {
    llama::apply_fsdp(model, mesh, {.reshard_after_forward = o.reshard_after_forward, .prefetch = o.fsdp_prefetch});
  }
}

TrainResult train(llama::LlamaForCausalLM& model, const TrainOptions& o, const Corpus& corpus,
                  const dtensor::DeviceMesh& mesh, const TrainHooks& hooks) {
  const dtensor::DeviceMesh tp_mesh = tp_mesh_of(mesh);
  const int64_t dp = dp_size_of(mesh);
  const int64_t dp_rank = dp == 1 ? 0 : mesh.get_local_rank("dp");
  if (o.batch % dp != 0) {
    throw dtensor::Error("dtensor: llama_train: batch " + std::to_string(o.batch) + " is not divisible by dp " + std::to_string(dp));
  }
  TrainResult result;
  result.param_bytes_per_rank = local_param_bytes(model);

  // Each parameter once: with tied embeddings lm_head.weight is model.embed_tokens.weight.
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters()) {
    if (std::none_of(params.begin(), params.end(), [&](const at::Tensor& q) { return q.is_same(p); })) params.push_back(p);
  }
  for (const auto& p : params) result.num_params += p.numel();
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  const bool loss_parallel = o.loss_parallel && o.plan != "hf" && tp_mesh.size() > 1;
  const int64_t start = o.resume ? resume_from_checkpoint(o, model, optimizer) : 0;
  result.start_step = start;
  const int64_t end = o.stop_after > 0 ? std::min(o.steps, o.stop_after) : o.steps;
  for (int64_t step = start; step < end; ++step) {
    StepRecord rec;
    rec.step = step;
    rec.lr = lr_at(o, step);
    for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(rec.lr);
    // The global batch (the same on every rank), of which this dp rank takes rows [dp_rank * B/dp, +B/dp).
    Batch batch = sample_batch(corpus, o.batch, o.seq_len, o.seed, step);
    if (dp > 1) {
      const int64_t rows = o.batch / dp;
      batch.inputs = batch.inputs.narrow(0, dp_rank * rows, rows);
      batch.labels = batch.labels.narrow(0, dp_rank * rows, rows);
    }
    const auto start = std::chrono::steady_clock::now();
    const int64_t comm_start = dtensor::exposed_comm_ns();
    optimizer.zero_grad();
    {
      dtensor::CommDebugMode comm;
      std::optional<dtensor::LossParallelGuard> guard;
      if (loss_parallel) guard.emplace();
      const c10::Device device = tp_mesh.device();
      at::Tensor loss = next_token_loss(model(batch.inputs.to(device)), batch.labels.to(device));
      loss.backward();
      rec.loss = scalar(loss);
      rec.fwd_bwd_counts = comm.get_comm_counts();
      rec.fwd_bwd_bytes = comm.get_comm_bytes();
    }
    // Each dp rank's loss is its rows' mean: the global batch's mean is their average (equal row counts).
    // Reporting only: outside the counted collectives.
    if (dp > 1) rec.loss = dtensor::all_reduce(at::full({1}, rec.loss, at::kDouble), dtensor::ReduceOp::AVG, mesh, 0).item<double>();
    if (hooks.after_backward) hooks.after_backward(step, model);
    {
      dtensor::CommDebugMode comm;
      // Clipping needs the global norm: each DTensor gradient's norm reduces over its shards.
      // --max-norm 0: no clipping and no norm (grad_norm NaN).
      rec.grad_norm = o.max_norm > 0 ? dtensor::clip_grad_norm_(params, o.max_norm) : NAN;
      optimizer.step();
      rec.update_counts = comm.get_comm_counts();
      rec.update_bytes = comm.get_comm_bytes();
    }
    rec.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    rec.comm_ms = static_cast<double>(dtensor::exposed_comm_ns() - comm_start) / 1e6;
    result.steps.push_back(rec);
    if (hooks.after_step) hooks.after_step(rec);
    if (o.checkpoint_every > 0 && ((step + 1) % o.checkpoint_every == 0 || step + 1 == end)) {
      save_checkpoint(o, model, optimizer, step + 1);
    }
  }
  for (const auto& p : params) result.grad_bytes_per_rank += local_bytes(p.grad());
  for (const auto& [_, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    result.optimizer_bytes_per_rank += local_bytes(s.exp_avg()) + local_bytes(s.exp_avg_sq());
  }
  return result;
}

void write_dump(llama::LlamaForCausalLM& model, const TrainOptions& o, const Corpus& corpus) {
  std::ofstream bin(o.dump + ".bin", std::ios::binary);
  if (!bin) throw dtensor::Error("dtensor: llama_train: cannot write '" + o.dump + ".bin'");
  int64_t offset = 0;
  auto write = [&](const at::Tensor& t) {
    at::Tensor c = t.detach().contiguous();
    const auto bytes = static_cast<int64_t>(c.numel() * c.element_size());
    bin.write(static_cast<const char*>(c.data_ptr()), bytes);
    nlohmann::json entry = {{"offset", offset}, {"shape", c.sizes().vec()}, {"dtype", c.scalar_type() == at::kFloat ? "float32" : "int64"}};
    offset += bytes;
    return entry;
  };
  nlohmann::json j;
  const auto& c = o.model;
  j["config"] = {{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size}, {"num_hidden_layers", c.num_hidden_layers},
                 {"num_attention_heads", c.num_attention_heads}, {"num_key_value_heads", c.num_key_value_heads},
                 {"intermediate_size", c.intermediate_size}, {"rope_theta", c.rope_theta}, {"rms_norm_eps", c.rms_norm_eps}};
  j["train"] = {{"seq_len", o.seq_len}, {"batch", o.batch}, {"steps", o.steps}, {"lr", o.lr}, {"warmup", o.warmup},
                {"max_norm", o.max_norm}, {"weight_decay", 0.1}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}};
  for (const auto& item : model->named_parameters()) j["params"][item.key()] = write(item.value());
  for (int64_t step = 0; step < o.steps; ++step) {
    const Batch b = sample_batch(corpus, o.batch, o.seq_len, o.seed, step);
    j["batches"].push_back({{"inputs", write(b.inputs)}, {"labels", write(b.labels)}});
  }
  std::ofstream(o.dump + ".json") << j.dump(1);
}

}  // namespace llama_train
