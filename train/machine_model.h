// The machine a plan's step time is estimated for (dtensor/plan/cost_model.h's matmul rate, memory bandwidth and
// per-DTensor-op cost). A plan must answer the same each time it is asked, so llama_plan and llama_train --plan auto
// price on a *stated* machine by default: the development machine's numbers, fixed in the source. A *measured* one
// (llama_plan --machine measured) is timed here, each number the median of 5 runs with its range quoted, and cached
// per machine (CPU model and thread count) in $XDG_CACHE_HOME/dtensor/machine (~/.cache/dtensor/machine), so that later runs
// reuse it; --remeasure times it again.
#pragma once

#include <string>

#include <c10/core/ScalarType.h>

#include "dtensor/plan/cost_model.h"

namespace train {

// The stated machine: the collectives of dtensor::default_cost_model() and the development machine's matmul rate,
// memory bandwidth and DTensor op cost (one thread, AMD EPYC, 2026-11-26). Its machine_source says so.
dtensor::CostModel fixed_cost_model();

// The stated model with this machine's numbers in `dtype`: from the cache when it holds them (unless `remeasure`),
// else measured (about 2 s) and cached. machine_source names the CPU, the threads, when, and each number's range.
dtensor::CostModel measured_cost_model(at::ScalarType dtype, bool remeasure);

// Where the measured models are cached (a directory).
std::string machine_cache_dir();

}  // namespace train
