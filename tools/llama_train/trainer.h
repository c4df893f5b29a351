// llama_train's training loop, shared by the program (main.cpp) and the parity tests: build the model from
// the seed, apply the plan, and train with AdamW, warmup + cosine learning rate, gradient clipping and
// (with loss parallel) cross-entropy on vocab-sharded logits. Every step's collectives are counted.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data.h"
#include "dtensor/mesh/device_mesh.h"
#include "llama/model.h"
#include "options.h"

namespace llama_train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0, grad_norm = 0, lr = 0, ms = 0;
  double comm_ms = 0;  // exposed communication: this rank's main thread inside collectives (comm_clock.h)
  std::map<std::string, int64_t> fwd_bwd_counts, fwd_bwd_bytes;  // forward + backward, by collective
  std::map<std::string, int64_t> update_counts, update_bytes;    // grad clipping + optimizer step
  int64_t total_counts() const;
  int64_t total_bytes() const;
};

struct TrainHooks {
  // Runs on every rank after each step's backward (before clipping and the optimizer step).
  std::function<void(int64_t step, llama::LlamaForCausalLM& model)> after_backward;
  // Runs on every rank after each step.
  std::function<void(const StepRecord&)> after_step;
};

struct TrainResult {
  int64_t start_step = 0;  // > 0 when resumed from a checkpoint
  std::vector<StepRecord> steps;
  int64_t param_bytes_per_rank = 0;
  int64_t grad_bytes_per_rank = 0;       // after the last step's backward (local shards)
  int64_t optimizer_bytes_per_rank = 0;  // AdamW's exp_avg and exp_avg_sq after the last step (local shards)
  int64_t num_params = 0;  // of the whole model
};

// Mean next-token cross-entropy of logits [b, s, vocab] against labels [b, s]. With loss parallel the logits
// are Shard(-1) (vocab) and a LossParallelGuard makes log_softmax / nll_loss reduce across ranks instead of
// gathering the logits.
at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& labels);

// The model for `options`, initialized from options.seed (the same on every rank), not yet parallelized.
llama::LlamaForCausalLM make_model(const TrainOptions& options);
// The mesh for `options` over a world of `world_size` ranks: 1-D ("tp") at dp 1, else 2-D ("dp", "tp") with
// the TP ranks adjacent (rank = dp_index * tp + tp_index: TP inside a host, data parallel across).
dtensor::DeviceMesh make_mesh(const TrainOptions& options, int64_t world_size);
// The tp sub-mesh of a mesh from make_mesh (the mesh itself when 1-D), and the data-parallel degree.
dtensor::DeviceMesh tp_mesh_of(const dtensor::DeviceMesh& mesh);
int64_t dp_size_of(const dtensor::DeviceMesh& mesh);

// Applies options.plan on the tp dim of `mesh` (nothing at TP 1: the plain model, no DTensors), then, at
// dp > 1, options.data_parallel over its dp dim (replicate or fully_shard).
void parallelize(llama::LlamaForCausalLM& model, const TrainOptions& options, const dtensor::DeviceMesh& mesh);

// Trains `model` (from make_model + parallelize) for options.steps steps on batches from `corpus`; `mesh`
// is the one parallelize got. Each dp rank trains on its rows of the global batch (batch / dp); the
// recorded loss is the global batch's mean (averaged over dp). With
// options.resume it first loads the newest checkpoint (model, optimizer, data position) and continues from
// there; with options.checkpoint_every it saves one every N steps (checkpointing.h).
TrainResult train(llama::LlamaForCausalLM& model, const TrainOptions& options, const Corpus& corpus,
                  const dtensor::DeviceMesh& mesh, const TrainHooks& hooks = {});

// The learning rate of step `step` (0-based): linear warmup over `warmup` steps to `lr`, then cosine decay
// to lr / 10 at the last step.
double lr_at(const TrainOptions& options, int64_t step);

// Bytes of this rank's parameters (the local shards of DTensors).
int64_t local_param_bytes(llama::LlamaForCausalLM& model);

// Writes options.dump (+ ".json"): the model's current (unparallelized) weights and every step's batch, for
// tests/oracle/llama_oracle.py.
void write_dump(llama::LlamaForCausalLM& model, const TrainOptions& options, const Corpus& corpus);

}  // namespace llama_train
