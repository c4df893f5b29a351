// The plan search for Llama (dtensor::auto_plan over llama_train's own plans): the candidates compose
//   - the TP pairs: torchtitan's Colwise / Rowwise plan, or HF's tp_plan;
//   - with torchtitan's: sequence parallel on / off, loss parallel on / off, async TP (with SP) on / off;
//   - over dp > 1: FSDP or DDP;
// key/value heads fewer than the TP degree replicated by the plans themselves. Each is dry-run (the real plan on
// meta tensors) and costed with the cost model; the fastest that fits the memory budget wins. Every decoder layer
// is the same module, so a per-layer choice is the same for each layer: the search composes per module kind
// (attention, MLP, norms, embeddings, lm_head) through these knobs.
#pragma once

#include <nlohmann/json.hpp>

#include <ostream>
#include <vector>

#include "dtensor/plan/auto_plan.h"
#include "train/machine_model.h"
#include "train/plan_dry_run.h"

namespace train {

// The candidates around `base` (its model, tp, dp, batch, sequence length): every composition above, in a fixed
// order (the hand-written default, torchtitan with SP and loss parallel over DDP, first).
std::vector<PlanOptions> candidate_plans(const PlanOptions& base);
std::string candidate_name(const PlanOptions& o);

struct SearchResult {
  dtensor::AutoPlanResult result;
  PlanOptions best;  // the winner, as llama_train's options take it
};
// Throws dtensor::Error when no candidate fits options.memory_budget_bytes.
SearchResult search_plan(const PlanOptions& base, const dtensor::AutoPlanOptions& options);

// {"plan": {module: style}, "predicted_step_ms", "predicted_peak_bytes_per_rank", "why", "knobs", "runner_up",
//  "candidates": [...], ...}
nlohmann::json search_json(const PlanOptions& base, const SearchResult& r, const dtensor::AutoPlanOptions& options);

// The table: every candidate's prediction, the winner's plan, why it won, and a `summary` line.
void print_search(std::ostream& os, const PlanOptions& base, const SearchResult& r, const dtensor::AutoPlanOptions& options);

// fixed_cost_model(), the cost model llama_train --plan auto uses (the stated machine: every rank computes the same
// choice without communicating), is in train/machine_model.h.

}  // namespace train
