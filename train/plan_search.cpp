#include "train/plan_search.h"

#include <algorithm>

#include "dtensor/core/error.h"
#include "llama/parallelize.h"

namespace train {
namespace {

std::map<std::string, std::string> plan_map(const PlanOptions& o) {
  std::map<std::string, std::string> out;
  if (o.tp <= 1) return out;  // the plain model on every rank
  try {
    const dtensor::ParallelizePlan plan =
        o.plan == llama::TPPlan::hf
            ? llama::hf_plan(o.model, o.tp)
            : llama::torchtitan_plan(o.model, o.tp,
                                     {.sequence_parallel = o.sequence_parallel, .loss_parallel = o.loss_parallel,
                                      .async_tp = o.async_tp});
    for (const auto& [path, style] : plan) out[path] = style->name();
  } catch (const dtensor::Error&) {
    // The dry run raises the same error and records it.
  }
  return out;
}

std::map<std::string, std::string> knobs(const PlanOptions& o) {
  auto on = [](bool b) { return std::string(b ? "on" : "off"); };
  std::map<std::string, std::string> k = {{"tp_plan", llama::to_string(o.plan)},
                                          {"data_parallel", o.data_parallel == models::DataParallel::fsdp ? "fsdp" : "ddp"}};
  if (o.tp > 1 && o.plan == llama::TPPlan::torchtitan) {
    k["sequence_parallel"] = on(o.sequence_parallel);
    k["loss_parallel"] = on(o.loss_parallel);
    k["async_tp"] = on(o.async_tp);
  }
  return k;
}

nlohmann::json score_json(const dtensor::CandidateScore& s) {
  nlohmann::json j = {{"name", s.name}, {"knobs", s.knobs}, {"ran", s.ran}, {"fits", s.fits}};
  if (!s.ran) {
    j["error"] = s.error;
    return j;
  }
  j["predicted_step_ms"] = s.predicted_step_ms;
  j["predicted_compute_ms"] = s.predicted_compute_ms;
  j["predicted_other_ms"] = s.predicted_other_ms;
  j["predicted_dispatch_ms"] = s.predicted_dispatch_ms;
  j["predicted_comm_ms"] = s.predicted_comm_ms;
  j["predicted_peak_bytes_per_rank"] = s.predicted_peak_bytes;
  j["collectives_per_step"] = s.collectives;
  j["comm_bytes_per_step"] = s.comm_bytes;
  j["dtensor_ops_per_step"] = s.dtensor_ops;
  return j;
}

}  // namespace

std::string candidate_name(const PlanOptions& o) {
  std::string n = o.tp > 1 ? llama::to_string(o.plan) : "no-tp";
  if (o.tp > 1 && o.plan == llama::TPPlan::torchtitan) {
    n += o.sequence_parallel ? "+sp" : "-sp";
    n += o.loss_parallel ? "+loss_parallel" : "-loss_parallel";
    if (o.async_tp) n += "+async_tp";
  }
  if (o.dp > 1) n += o.data_parallel == models::DataParallel::fsdp ? " fsdp" : " ddp";
  return n;
}

std::vector<PlanOptions> candidate_plans(const PlanOptions& base) {
  std::vector<PlanOptions> out;
  std::vector<models::DataParallel> dps = {models::DataParallel::ddp};
  if (base.dp > 1) dps.push_back(models::DataParallel::fsdp);
  for (auto dp : dps) {
    auto add = [&](llama::TPPlan plan, bool sp, bool lp, bool async) {
      PlanOptions o = base;
      o.plan = plan, o.sequence_parallel = sp, o.loss_parallel = lp, o.async_tp = async, o.data_parallel = dp;
      out.push_back(o);
    };
    if (base.tp <= 1 || base.ep > 1) {  // no TP pairs to choose (EP keeps llama_train's own TP plan)
      add(llama::TPPlan::torchtitan, base.sequence_parallel, base.loss_parallel, false);
      continue;
    }
    for (bool sp : {true, false}) {
      for (bool lp : {true, false}) {
        add(llama::TPPlan::torchtitan, sp, lp, false);
        if (sp) add(llama::TPPlan::torchtitan, sp, lp, true);
      }
    }
    add(llama::TPPlan::hf, false, false, false);
  }
  return out;
}

SearchResult search_plan(const PlanOptions& base, const dtensor::AutoPlanOptions& options) {
  const std::vector<PlanOptions> plans = candidate_plans(base);
  std::vector<dtensor::PlanCandidate> candidates;
  for (const auto& p : plans) {
    candidates.push_back({candidate_name(p), plan_map(p), knobs(p), [p] { return dry_run_llama(p); }});
  }
  SearchResult r{dtensor::auto_plan(candidates, options), base};
  for (const auto& p : plans) {
    if (candidate_name(p) == r.result.best.name) r.best = p;
  }
  return r;
}

nlohmann::json search_json(const PlanOptions& base, const SearchResult& r, const dtensor::AutoPlanOptions& options) {
  const dtensor::CandidateScore& b = r.result.best;
  nlohmann::json candidates = nlohmann::json::array();
  for (const auto& s : r.result.candidates) candidates.push_back(score_json(s));
  nlohmann::json j = {{"plan", b.plan},
                      {"plan_name", b.name},
                      {"knobs", b.knobs},
                      {"predicted_step_ms", b.predicted_step_ms},
                      {"predicted_peak_bytes_per_rank", b.predicted_peak_bytes},
                      {"why", r.result.why},
                      {"mesh", {{"tp", base.tp}, {"dp", base.dp}}},
                      {"memory_budget_bytes", options.memory_budget_bytes},
                      {"cost_model", {{"matmul_gflops", options.cost.matmul_gflops}, {"comm_source", options.cost.comm_source},
                                      {"machine_source", options.cost.machine_source}}},
                      {"candidates", candidates}};
  j["runner_up"] = r.result.runner_up ? score_json(*r.result.runner_up) : nlohmann::json(nullptr);
  return j;
}

void print_search(std::ostream& os, const PlanOptions& base, const SearchResult& r, const dtensor::AutoPlanOptions& options) {
  char line[256];
  os << "# plan search: tp " << base.tp << ", dp " << base.dp << ", batch " << base.batch << " x " << base.seq_len
     << " tokens; cost model: matmul " << options.cost.matmul_gflops << " GFLOP/s, memory " << options.cost.memory_gbps
     << " GB/s, " << options.cost.dtensor_op_us << " us per DTensor op, " << options.cost.comm_source << "\n";
  if (!options.cost.machine_source.empty()) os << "# machine: " << options.cost.machine_source << "\n";
  if (options.memory_budget_bytes > 0) os << "# memory budget: " << (options.memory_budget_bytes >> 20) << " MiB per rank\n";
  std::snprintf(line, sizeof line, "%-44s %10s %10s %10s %10s %10s %6s %7s %10s %5s\n", "candidate", "step_ms", "matmul",
                "other", "dispatch", "comm", "colls", "dt_ops", "peak_MB", "fits");
  os << line;
  int fitting = 0;
  for (const auto& s : r.result.candidates) {
    if (!s.ran) {
      os << s.name << ": refused: " << s.error << "\n";
      continue;
    }
    fitting += s.fits;
    std::snprintf(line, sizeof line, "%-44s %10.3f %10.3f %10.3f %10.3f %10.3f %6lld %7lld %10.2f %5s\n", s.name.c_str(),
                  s.predicted_step_ms, s.predicted_compute_ms, s.predicted_other_ms, s.predicted_dispatch_ms,
                  s.predicted_comm_ms, static_cast<long long>(s.collectives),
                  static_cast<long long>(s.dtensor_ops),
                  static_cast<double>(s.predicted_peak_bytes) / 1e6, s.fits ? "yes" : "no");
    os << line;
  }
  os << "\nchosen: " << r.result.best.name << "\nwhy: " << r.result.why << "\nplan:\n";
  for (const auto& [path, style] : r.result.best.plan) os << "  " << path << ": " << style << "\n";
  std::string name = r.result.best.name;  // "torchtitan+sp+loss_parallel fsdp" -> one token
  std::replace(name.begin(), name.end(), ' ', '/');
  os << "summary plan=" << name
     << " predicted_step_ms=" << r.result.best.predicted_step_ms
     << " predicted_peak_bytes_per_rank=" << r.result.best.predicted_peak_bytes
     << " candidates=" << r.result.candidates.size() << " fitting=" << fitting << "\n";
}


}  // namespace train
