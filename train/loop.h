// The training loop (torchtitan's Trainer.train): the model from the seed, AdamW over each parameter once,
// warmup + cosine learning rate, one train_step per batch (step.h), resume from and save checkpoints
// (checkpointing.h). Shared by llama_train (tools/llama_train/main.cpp) and the tests.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "common/parallel_dims.h"
#include "llama/model.h"
#include "llama/parallelize.h"
#include "train/data.h"
#include "train/options.h"
#include "train/step.h"

namespace train {

struct TrainHooks {
  // Runs on every rank after each step's backward (before clipping and the optimizer step).
  std::function<void(int64_t step, llama::LlamaForCausalLM& model)> after_backward;
  // Runs on every rank after each step.
  std::function<void(const StepRecord&)> after_step;
  // Asked on every rank after each step (after after_step); the answer must be the same on every rank (llama_train
  // all-reduces its SIGTERM flag). True: a checkpoint of this step is saved (with options.checkpoint_dir) and the run
  // stops there, as torchtitan's preemption handling; --resume continues with the same losses.
  std::function<bool(int64_t step)> stop_requested;
};

struct TrainResult {
  int64_t start_step = 0;  // > 0 when resumed from a checkpoint
  std::vector<StepRecord> steps;
  int64_t param_bytes_per_rank = 0;
  int64_t grad_bytes_per_rank = 0;       // after the last step's backward (local shards)
  int64_t optimizer_bytes_per_rank = 0;  // AdamW's exp_avg and exp_avg_sq after the last step (local shards)
  int64_t num_params = 0;  // of the whole model
  bool stopped_early = false;   // stop_requested said so
  int64_t saved_step = 0;       // the last checkpoint this run saved (0: none)
};

// The model for `options`, initialized from options.seed (the same on every rank) or, with options.hf_dir,
// from that checkpoint's weights; not yet parallelized.
llama::LlamaForCausalLM make_model(const TrainOptions& options);

// The model for `options` parallelized on `dims` (which hold their mesh): llama::build_model (llama/build.h) with the
// seeded init or options.hf_dir, parallelize_config(options) and param_dtype(options). No rank ever holds the whole
// model. The same parameters as make_model + parallelize (the eager reference path, which the tests compare it with).
llama::LlamaForCausalLM build_model(const TrainOptions& options, const models::ParallelDims& dims);

// parallelize_llama(model, dims of `mesh`, parallelize_config(options)) on a mesh laid out as ParallelDims
// lays it out (1-D "tp", or ("dp", "tp")); returns the dims, holding the mesh, for run().
models::ParallelDims parallelize(llama::LlamaForCausalLM& model, const TrainOptions& options,
                                 const dtensor::DeviceMesh& mesh);

// Trains `model` (parallelized on `dims`) for options.steps steps on batches from `corpus`. Each dp rank
// trains on its rows of the global batch (batch / dp); the recorded loss is the global batch's mean (averaged
// over dp). With options.resume it first loads the newest checkpoint (model, optimizer, data position) and
// continues from there; with options.checkpoint_every it saves one every N steps (checkpointing.h).
// options.global_batch > options.batch: each step's global_batch sequences run as micro-batches of options.batch
// (gradient accumulation, step.h), the same rows as one batch of global_batch. `eval_corpus` (may be null): the
// held-out split, evaluated after every options.eval_every steps and after the last (StepRecord::eval_loss).
TrainResult run(llama::LlamaForCausalLM& model, const TrainOptions& options, const Corpus& corpus,
                const models::ParallelDims& dims, const TrainHooks& hooks = {}, const Corpus* eval_corpus = nullptr);

// Bytes of this rank's parameters (the local shards of DTensors).
int64_t local_param_bytes(llama::LlamaForCausalLM& model);

}  // namespace train
