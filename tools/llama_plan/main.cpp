// llama_plan: the plan dry run for Llama (plan.h) as a command (options.h), with tables or JSON (report.h)
// and a step-time estimate (cost_model.h). Exit 2 for bad flags and for a plan the library refuses.
#include <c10/util/Exception.h>

#include <iostream>

#include "dtensor/plan/cost_model.h"
#include "dtensor/core/error.h"
#include "options.h"
#include "train/plan_report.h"
#include "train/machine_model.h"
#include "train/plan_search.h"

int main(int argc, char** argv) {
  llama_plan::CliOptions o;
  try {
    o = llama_plan::parse_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const tools_cli::UsageError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  if (o.help) {
    std::cout << llama_plan::help_text();
    return 0;
  }
  try {
    const at::ScalarType compute = train::compute_dtype(o.plan);
    dtensor::CostModel cost = o.machine == "measured" ? train::measured_cost_model(compute, o.remeasure) : train::fixed_cost_model();
    if (!o.comm_table.empty()) dtensor::load_comm_table(cost, o.comm_table);
    if (o.mm_gflops > 0) cost.matmul_gflops = o.mm_gflops;
    if (o.memory_gbps > 0) cost.memory_gbps = o.memory_gbps;
    if (o.dtensor_op_us >= 0) cost.dtensor_op_us = o.dtensor_op_us;
    if (o.mm_gflops > 0 || o.memory_gbps > 0 || o.dtensor_op_us >= 0) cost.machine_source += " (numbers given on the command line replace its)";
    if (o.plan.plan_auto) {
      const dtensor::AutoPlanOptions search_options{.memory_budget_bytes = o.plan.memory_budget_mb << 20, .cost = cost};
      if (!o.json) std::cerr << "llama_plan: searching plans for " << o.plan.model.to_string() << " at tp " << o.plan.tp << "...\n";
      const train::SearchResult r = train::search_plan(o.plan, search_options);
      if (o.json) {
        std::cout << train::search_json(o.plan, r, search_options).dump(1) << "\n";
      } else {
        train::print_search(std::cout, o.plan, r, search_options);
      }
      return 0;
    }
    if (o.plan.pp > 1) {
      DTENSOR_CHECK(!o.json, "llama_plan: --json with --pp is not supported yet (the tables are)");
      std::cerr << "llama_plan: dry run of " << o.plan.model.to_string() << " at pp " << o.plan.pp << " x tp " << o.plan.tp
                << ", stage by stage...\n";
      train::print_pipeline(std::cout, o.plan, train::dry_run_llama_pipeline(o.plan), cost);
      return 0;
    }
    if (!o.json) std::cerr << "llama_plan: dry run of " << o.plan.model.to_string() << " at tp " << o.plan.tp << "...\n";
    const dtensor::DryRunReport report = train::dry_run_llama(o.plan);
    if (o.json) {
      std::cout << train::to_json(o.plan, report, cost).dump(1) << "\n";
    } else {
      train::print_tables(std::cout, o.plan, report, cost);
    }
    return 0;
  } catch (const dtensor::Error& e) {
    std::cerr << "error: " << e.what() << "\n";  // the plan refused (a shape the TP degree cannot split)
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "llama_plan: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "llama_plan: " << e.what() << "\n";
    return 1;
  }
}
