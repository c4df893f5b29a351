// The Llama plan dry run: llama_train's step (parallelize_llama: torchtitan's TP plan, loss parallel, DDP or
// FSDP over dp; AdamW) for one rank of a dp x tp mesh, on meta tensors (dtensor/plan/dry_run.h). Shared by llama_plan and the tests.
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

struct PlanOptions {
  llama::LlamaConfig model;
  int64_t seq_len = 64;
  int64_t batch = 4;  // global: each data-parallel rank takes batch / dp sequences
  int64_t tp = 2;
  int64_t dp = 1;
  int64_t ep = 1;  // expert parallelism over ep of the dp ranks (a mixture of experts), as llama_train's --ep
  int64_t cp = 1;  // context parallelism: each sequence over cp ranks (ring attention), as llama_train's --cp
  std::string cp_rotate_method = "allgather";
  models::DataParallel data_parallel = models::DataParallel::ddp;  // over dp, as llama_train's --ddp / --fsdp
  llama::TPPlan tp_plan = llama::TPPlan::torchtitan;              // as llama_train's --plan
  bool sequence_parallel = true;
  bool loss_parallel = true;
  bool async_tp = false;   // SP's boundaries through async TP's fused ops, as llama_train's --async-tp
  bool optimizer = true;   // AdamW step (llama_train's optimizer)
  // Each tensor in its dtype, as llama_train's --dtype and --mixed-precision: the parameters (and so their gradients
  // and AdamW state) in param_dtype; with mp_policy the forward's copies, activations and TP collectives in its
  // param_dtype, FSDP's gathers in it and its reduce-scatters in reduce_dtype.
  at::ScalarType param_dtype = at::kFloat;
  std::optional<dtensor::MixedPrecisionPolicy> mp_policy;
  // As llama_train's --float8: the projections' matmuls in float8 (their operands' casts, the TP-wide amax all-reduces,
  // the float8 styles' all-gathers at 1 byte per element under tensorwise).
  std::optional<dtensor::Float8LinearConfig> float8;
  std::vector<int> ranks;  // simulated ranks; empty: rank 0 and the last
};

// llama_train's options as a plan at TP `tp`: its model, sequence length, batch, dp / ep, data parallel kind and plan
// knobs (the simulated ranks left at their default).
PlanOptions plan_options_of(const train::TrainOptions& options, int64_t tp);

// Throws dtensor::Error for what a real run would refuse (the plan's own errors among them, raised by the
// same code) and for batch not divisible by dp.
dtensor::DryRunReport dry_run_llama(const PlanOptions& options);

}  // namespace train
