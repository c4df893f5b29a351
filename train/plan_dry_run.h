// The Llama plan dry run: llama_train's step (parallelize_llama with llama_train's own ParallelDims and
// ParallelizeConfig: the TP plan, loss parallel, DDP or FSDP over dp, mixed precision, float8; AdamW) for one rank of
// its mesh, on meta tensors (dtensor/plan/dry_run.h). Shared by llama_plan, llama_train --plan auto and the tests.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/plan/dry_run.h"
#include "common/parallel_dims.h"
#include "llama/config.h"
#include "llama/parallelize.h"
#include "train/options.h"
#include "llama/parallelize_pipeline.h"

namespace train {

// The dry run's options: llama_train's own (the model, sequence length, global batch, the degrees with tp given, the
// plan and its knobs, FSDP's options, the dtypes, float8), so the dry run and the plan search parallelize exactly as
// training does (train::parallel_dims, train::parallelize_config), plus what only a dry run has.
struct PlanOptions : TrainOptions {
  PlanOptions() { tp = 2; }
  explicit PlanOptions(const TrainOptions& job) : TrainOptions(job) {}
  bool optimizer = true;   // AdamW step (llama_train's optimizer)
  std::vector<int> ranks;  // simulated ranks; empty: rank 0 and the last
};

// llama_train's options as a plan at TP `tp` (the simulated ranks left at their default).
PlanOptions plan_options_of(const train::TrainOptions& options, int64_t tp);

// Throws dtensor::Error for what a real run would refuse (the plan's own errors among them, raised by the
// same code) and for batch not divisible by dp.
dtensor::DryRunReport dry_run_llama(const PlanOptions& options);

// The dry run of a pipelined job (--pp > 1): each stage's step on one pipeline microbatch (its rows: batch / dp / M)
// on its own part of the mesh (the stage's model from llama::keep_stage, the same plan; a stage before the last
// backpropagates an output gradient of its output's shape), and what the schedule adds: the simulated bubble, the
// microbatches each rank holds at once, and the point-to-point bytes per step.
struct PipelinePlan {
  struct Stage {
    llama::StageLayers layers;
    dtensor::DryRunReport report;  // one microbatch's step
    int in_flight = 1;             // most microbatches whose activations the stage's rank holds at once
    // report's peak with the schedule's in-flight microbatches: peak + (in_flight - 1) x activation bytes.
    int64_t peak_bytes_with_schedule = 0;
  };
  std::vector<Stage> stages;
  double bubble_fraction = 0;      // simulate() with F = I = W
  int microbatches = 1;
  int64_t p2p_bytes_per_step = 0;  // per boundary and rank: m activations forward and m gradients back
};
PipelinePlan dry_run_llama_pipeline(const PlanOptions& options);

}  // namespace train
