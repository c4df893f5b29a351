#include "dtensor/plan/auto_plan.h"

#include <algorithm>
#include <cstdio>

#include "dtensor/core/error.h"

namespace dtensor {
namespace {

CandidateScore score(const PlanCandidate& c, const AutoPlanOptions& options) {
  CandidateScore s;
  s.name = c.name;
  s.plan = c.plan;
  s.knobs = c.knobs;
  DryRunReport report;
  try {
    report = c.dry_run();
  } catch (const std::exception& e) {  // the plan's own refusal (dtensor::Error), or the op that failed
    s.error = e.what();
    return s;
  }
  s.ran = true;
  const RankReport& r0 = report.ranks.front();
  const StepEstimate e = estimate_step(r0, options.cost);
  s.predicted_step_ms = e.step_s * 1e3;
  s.predicted_compute_ms = e.compute_s * 1e3;
  s.predicted_other_ms = e.other_s * 1e3;
  s.predicted_dispatch_ms = e.dispatch_s * 1e3;
  s.predicted_comm_ms = e.comm_s * 1e3;
  s.dtensor_ops = r0.dtensor_ops;
  for (const auto& r : report.ranks) s.predicted_peak_bytes = std::max(s.predicted_peak_bytes, r.peak_bytes);
  for (const auto& rec : r0.comms) {
    s.collectives += rec.count;
    s.comm_bytes += rec.bytes;
  }
  s.fits = options.memory_budget_bytes <= 0 || s.predicted_peak_bytes <= options.memory_budget_bytes;
  return s;
}

// Fitting first, then faster, then smaller; stable for the rest (candidate order).
bool better(const CandidateScore& a, const CandidateScore& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.ran != b.ran) return a.ran;
  if (a.predicted_step_ms != b.predicted_step_ms) return a.predicted_step_ms < b.predicted_step_ms;
  return a.predicted_peak_bytes < b.predicted_peak_bytes;
}

std::string mb(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", static_cast<double>(bytes) / 1e6);
  return buf;
}

std::string ms(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", v);
  return buf;
}

// "12.345 ms (matmuls ..., the rest ..., N DTensor ops ..., communication ..., N collectives, peak ... MB)"
std::string prediction(const CandidateScore& s) {
  return ms(s.predicted_step_ms) + " (matmuls " + ms(s.predicted_compute_ms) + ", the rest " +
         ms(s.predicted_other_ms) + ", " + std::to_string(s.dtensor_ops) + " DTensor ops " +
         ms(s.predicted_dispatch_ms) + ", communication " + ms(s.predicted_comm_ms) + ", " +
         std::to_string(s.collectives) + " collectives, peak " + mb(s.predicted_peak_bytes) + ")";
}

}  // namespace

AutoPlanResult auto_plan(const std::vector<PlanCandidate>& candidates, const AutoPlanOptions& options) {
  DTENSOR_CHECK(!candidates.empty(), "dtensor: auto_plan got no candidates");
  AutoPlanResult result;
  for (const auto& c : candidates) result.candidates.push_back(score(c, options));
  std::stable_sort(result.candidates.begin(), result.candidates.end(), better);
  const CandidateScore& best = result.candidates.front();
  if (!best.ran) throw DTENSOR_ERROR("dtensor: auto_plan: no candidate plan runs on this mesh; the first refused: ", best.error);
  if (!best.fits) {
    int64_t smallest = best.predicted_peak_bytes;
    std::string which = best.name;
    for (const auto& s : result.candidates) {
      if (s.ran && s.predicted_peak_bytes < smallest) smallest = s.predicted_peak_bytes, which = s.name;
    }
    throw DTENSOR_ERROR("dtensor: auto_plan: no candidate fits the memory budget of ", mb(options.memory_budget_bytes),
                        " per rank; the smallest peak is ", mb(smallest), " (", which, ")");
  }
  // The incumbent stays unless the fastest beats it by min_gain (it then moves to the front).
  const std::string incumbent = candidates.front().name;
  auto inc = std::find_if(result.candidates.begin(), result.candidates.end(),
                          [&](const CandidateScore& s) { return s.name == incumbent; });
  bool kept = false;
  if (inc != result.candidates.begin() && inc->fits &&
      best.predicted_step_ms > inc->predicted_step_ms * (1.0 - options.min_gain)) {
    std::rotate(result.candidates.begin(), inc, inc + 1);
    kept = true;
  }
  result.best = result.candidates.front();
  if (result.candidates.size() > 1 && result.candidates[1].fits) {
    const CandidateScore& best = result.best;
    const CandidateScore& r = result.candidates[1];
    result.runner_up = r;
    result.why = best.name + " predicts " + prediction(best) + " per step against the runner-up " + r.name + "'s " +
                 prediction(r);
    if (kept) {
      char gain[64];
      std::snprintf(gain, sizeof gain, "%.1f%%", 100.0 * (1.0 - r.predicted_step_ms / best.predicted_step_ms));
      result.why += "; the hand-written plan stays: " + r.name + " is predicted only " + gain +
                    " faster, within the cost model's error (min_gain " + std::to_string(static_cast<int>(options.min_gain * 100)) + "%)";
    }
  } else {
    result.why = result.best.name + " is the only candidate that runs and fits";
  }
  if (options.memory_budget_bytes > 0) {
    int64_t over = 0;
    for (const auto& s : result.candidates) over += s.ran && !s.fits;
    if (over > 0) result.why += "; " + std::to_string(over) + " candidates exceed the budget of " + mb(options.memory_budget_bytes);
  }
  return result;
}

}  // namespace dtensor
