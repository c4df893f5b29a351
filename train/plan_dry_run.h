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

}  // namespace train
