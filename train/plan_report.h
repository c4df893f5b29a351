// llama_plan's output: tables (per layer, totals, memory, estimate) or one JSON object, and the summary line.
#pragma once

#include <nlohmann/json.hpp>

#include <ostream>

#include "dtensor/plan/cost_model.h"
#include "train/plan_dry_run.h"

namespace train {

using dtensor::CostModel;
using dtensor::StepEstimate;


void print_tables(std::ostream& os, const PlanOptions& options, const dtensor::DryRunReport& report,
                  const CostModel& cost);
nlohmann::json to_json(const PlanOptions& options, const dtensor::DryRunReport& report, const CostModel& cost);
// --pp: each stage's tables (print_tables of its microbatch's step), then the pipeline's: the schedule's simulated
// bubble, each stage's microbatches in flight and its peak with them, the point-to-point bytes per step.
void print_pipeline(std::ostream& os, const PlanOptions& options, const PipelinePlan& plan, const CostModel& cost);
// "summary key=value ...": the last line of the table output.
std::string summary_line(const PlanOptions& options, const dtensor::DryRunReport& report, const CostModel& cost);

}  // namespace train
