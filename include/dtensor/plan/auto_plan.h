// Automatic plan search: the plan for a model and a mesh, chosen from measured costs.
//
//   dtensor::AutoPlanResult r = dtensor::auto_plan<llama::LlamaForCausalLM>(
//       [&] { return llama::LlamaForCausalLM(config); }, {2},       // the model (on meta) and the mesh
//       candidates,                                                  // PlanChoice: a name, how to apply it, ...
//       [&](auto& model, const dtensor::DeviceMesh& mesh) { return loss_of(model, mesh); },
//       {.memory_budget_bytes = 64 << 20});
//
// Each candidate runs once as a dry run (dry_run.h: one training step of one rank on meta tensors, through the
// real plan, dispatch and styles): exact collectives, bytes and memory. Its step time is then estimated with the
// cost model (cost_model.h: this machine's measured matmul rate, memory bandwidth and comm_bench's collective
// costs). The search keeps the candidates whose predicted peak memory per rank fits the budget and picks the fastest
// predicted step (ties: the smaller peak, then the earlier candidate), unless the first candidate (the incumbent,
// the hand-written plan) fits and is predicted within AutoPlanOptions::min_gain of it: then the incumbent stays. A
// candidate the plan itself refuses (a shape the mesh cannot split) is kept in the table with its error, never
// chosen.
//
// What is searched is the caller's: the candidate list. models/llama's search (train/plan_search.h)
// composes torchtitan's and HF's Colwise / Rowwise pairs with sequence parallel, loss parallel, async TP and
// FSDP or DDP over dp.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/plan/cost_model.h"
#include "dtensor/plan/dry_run.h"

namespace dtensor {

// One candidate, already bound to its model, mesh and step: dry_run() runs it.
struct PlanCandidate {
  std::string name;                           // "torchtitan sp loss_parallel ddp", ...
  std::map<std::string, std::string> plan;    // module path (or pattern) -> style, for the report
  std::map<std::string, std::string> knobs;   // the settings that define it ("sequence_parallel": "on", ...)
  std::function<DryRunReport()> dry_run;
};

struct AutoPlanOptions {
  int64_t memory_budget_bytes = 0;  // per rank; 0: no limit
  CostModel cost = default_cost_model();
  // The first candidate is the incumbent (the hand-written plan). Another replaces it only when predicted faster by
  // at least this fraction: the cost model counts FLOPs, allocated bytes and collectives, not kernel efficiency at
  // small shapes or dispatch, so smaller predicted gains are within its error. 0: the fastest prediction always wins.
  double min_gain = 0.05;
};

struct CandidateScore {
  std::string name;
  std::map<std::string, std::string> plan, knobs;
  bool ran = false;         // false: the plan refused (error says why)
  std::string error;
  bool fits = false;        // ran and its peak is within the budget
  double predicted_step_ms = 0;
  double predicted_compute_ms = 0, predicted_other_ms = 0, predicted_comm_ms = 0;  // matmuls, the rest, collectives
  double predicted_dispatch_ms = 0;  // DTensor operator calls
  int64_t predicted_peak_bytes = 0;  // the largest over the simulated ranks
  int64_t collectives = 0, comm_bytes = 0;  // per step, rank 0
  int64_t dtensor_ops = 0;                  // per step, rank 0 (RankReport::dtensor_ops)
};

struct AutoPlanResult {
  CandidateScore best;
  std::optional<CandidateScore> runner_up;  // the next-best that fits
  std::vector<CandidateScore> candidates;   // every candidate, best first (those that do not fit or ran last)
  std::string why;                           // why the best beat the runner-up
};

// Scores every candidate and picks the best. Throws dtensor::Error when none fits the budget (naming the smallest
// peak found) or none ran (with the first error).
AutoPlanResult auto_plan(const std::vector<PlanCandidate>& candidates, const AutoPlanOptions& options = {});

// A candidate on the caller's model: how to apply it, and the dry run's options for it (a step guard such as
// loss parallel's, a gradient reduction after backward).
template <typename Model>
struct PlanChoice {
  std::string name;
  std::map<std::string, std::string> plan, knobs;
  std::function<void(Model&, const DeviceMesh&)> apply;
  DryRunOptions dry_run_options;
};

// The search over `choices` for the model model_factory builds, on a mesh of `mesh_shape`, with `step` as one
// training step's loss (as dry_run takes them).
template <typename Model>
AutoPlanResult auto_plan(const std::function<Model()>& model_factory, const std::vector<int64_t>& mesh_shape,
                         const std::vector<PlanChoice<Model>>& choices,
                         const std::function<at::Tensor(Model&, const DeviceMesh&)>& step,
                         const AutoPlanOptions& options = {}) {
  std::vector<PlanCandidate> candidates;
  for (const auto& c : choices) {
    candidates.push_back({c.name, c.plan, c.knobs, [&model_factory, &mesh_shape, &step, c] {
                            return dry_run<Model>(model_factory, mesh_shape, c.apply, step, c.dry_run_options);
                          }});
  }
  return auto_plan(candidates, options);
}

}  // namespace dtensor
