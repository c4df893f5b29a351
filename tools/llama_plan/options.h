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
  // plan: llama_train's options (the flags of tools/common/parallelism_flags.h); --search or --plan auto sets
  // plan.plan_auto (the plan search instead of one plan's dry run), --memory-budget-mb plan.memory_budget_mb.
  bool json = false;
  std::string comm_table;   // "": the built-in numbers
  // The machine the step is priced for (train/machine_model.h): "stated" (the default: the same answer every time)
  // or "measured" (timed here once, cached per machine; --remeasure times it again). The three numbers override it.
  std::string machine = "stated";
  bool remeasure = false;
  double mm_gflops = 0;     // 0: the machine's
  double memory_gbps = 0;   // 0: the machine's
  double dtensor_op_us = -1;  // < 0: the machine's
  bool help = false;
};

// Parses argv (without argv[0]); applies --preset / --hf-config first, then the size flags over them.
// Throws tools_cli::UsageError.
CliOptions parse_options(const std::vector<std::string>& args);
std::string help_text();

}  // namespace llama_plan
