// llama_plan's command line (tools/common/cli.h grammar; bad flags: one `error:` line, exit 2).
#pragma once

#include "tools/common/cli.h"

#include <string>
#include <vector>

#include "train/plan_dry_run.h"

namespace llama_plan {

using train::PlanOptions;

struct CliOptions {
  PlanOptions plan;
  bool json = false;
  bool search = false;              // --search: the plan search (search.h) instead of one plan's dry run
  int64_t memory_budget_mb = 0;     // --memory-budget-mb: per rank, for --search (0: none)
  std::string comm_table;   // "": the built-in numbers
  // The machine the step is priced for (train/machine_model.h): "stated" (the default: the same answer every time)
  // or "measured" (timed here once, cached per machine; --remeasure times it again). The three numbers override it.
  std::string machine = "stated";
  bool remeasure = false;
  double mm_gflops = 0;     // 0: the machine's
  double memory_gbps = 0;   // 0: the machine's
  double dtensor_op_us = -1;  // < 0: the machine's
  std::string dtype = "auto";  // --dtype, --mixed-precision: as llama_train's (PlanOptions' dtypes from them)
  std::string mixed_precision = "bf16";
  bool float8 = false;  // --float8, --float8-recipe: as llama_train's
  std::string float8_recipe = "tensorwise";
  bool help = false;
};

// Parses argv (without argv[0]); applies --preset / --hf-config first, then the size flags over them.
// Throws tools_cli::UsageError.
CliOptions parse_options(const std::vector<std::string>& args);
std::string help_text();

}  // namespace llama_plan
