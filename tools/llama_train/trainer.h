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
  int64_t num_params = 0;  // of the whole model
};

// The model for `options`, initialized from options.seed (the same on every rank), not yet parallelized.
llama::LlamaForCausalLM make_model(const TrainOptions& options);
// Applies options.plan on `tp_mesh` (nothing at TP 1: the plain model, no DTensors).
void parallelize(llama::LlamaForCausalLM& model, const TrainOptions& options, const dtensor::DeviceMesh& tp_mesh);

// Trains `model` (from make_model + parallelize) for options.steps steps on batches from `corpus`. With
// options.resume it first loads the newest checkpoint (model, optimizer, data position) and continues from
// there; with options.checkpoint_every it saves one every N steps (checkpointing.h).
TrainResult train(llama::LlamaForCausalLM& model, const TrainOptions& options, const Corpus& corpus,
                  const dtensor::DeviceMesh& tp_mesh, const TrainHooks& hooks = {});

// The learning rate of step `step` (0-based): linear warmup over `warmup` steps to `lr`, then cosine decay
// to lr / 10 at the last step.
double lr_at(const TrainOptions& options, int64_t step);

// Bytes of this rank's parameters (the local shards of DTensors).
int64_t local_param_bytes(llama::LlamaForCausalLM& model);

// Writes options.dump (+ ".json"): the model's current (unparallelized) weights and every step's batch, for
// tests/oracle/llama_oracle.py.
void write_dump(llama::LlamaForCausalLM& model, const TrainOptions& options, const Corpus& corpus);

}  // namespace llama_train
