#include "report.h"

#include <signal.h>

#include <algorithm>
#include <cstdio>

namespace fault_soak {
namespace {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

std::string config_of(const TrialSpec& s) {
  return "world=" + std::to_string(s.world) + " " + (s.under_tprun ? "tprun" : "hand") + " " + s.backend + " " +
         (s.signal == SIGKILL ? "SIGKILL" : "SIGSTOP");
}

void print_row(std::ostream& os, const std::string& key, const Tally& t) {
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %6d %9d %6d %11d %13d %6d %5d %8.2f %8.2f\n", key.c_str(), t.trials,
                t.setup_errors, t.count(Ending::OK), t.count(Ending::CLEAR_ERROR), t.count(Ending::UNCLEAR_ERROR),
                t.count(Ending::CRASH), t.count(Ending::HANG), quantile(t.exit_after_fault_s, 0.5),
                quantile(t.exit_after_fault_s, 1.0));
  os << line;
}

void print_table(std::ostream& os, const char* title, const std::map<std::string, Tally>& rows, const Tally& total) {
  char head[256];
  std::snprintf(head, sizeof head, "%-28s %6s %9s %6s %11s %13s %6s %5s %8s %8s\n", title, "trials", "setup_err", "ok",
                "clear_error", "unclear_error", "crash", "hang", "p50_s", "max_s");
  os << head;
  for (const auto& [key, t] : rows) print_row(os, key, t);
  print_row(os, "all", total);
}

}  // namespace

int Tally::count(Ending e) const {
  auto it = endings.find(e);
  return it == endings.end() ? 0 : it->second;
}

void Tally::add(const TrialResult& r) {
  ++trials;
  if (!r.setup_error.empty()) ++setup_errors;
  for (const auto& s : r.survivors) {
    ++endings[s.ending];
    if (r.injected && (s.ending != Ending::OK || s.exit_after_fault_s > 0)) exit_after_fault_s.push_back(s.exit_after_fault_s);
  }
}

void Report::add(const TrialResult& r) {
  by_phase_[r.phase_hit].add(r);
  by_config_[config_of(r.spec)].add(r);
  total_.add(r);
}

void Report::print(std::ostream& os, double timeout_s, double slack_s) const {
  os << "\nSurvivors by the victim's phase when the signal came (counts are survivors; p50_s/max_s: seconds from\n"
        "the signal to the survivor's exit; 'exited': the victim finished before its moment):\n";
  print_table(os, "phase", by_phase_, total_);
  os << "\nBy configuration:\n";
  print_table(os, "config", by_config_, total_);
  const Tally& t = total_;
  os << "summary trials=" << t.trials << " setup_errors=" << t.setup_errors << " ok=" << t.count(Ending::OK)
     << " clear_errors=" << t.count(Ending::CLEAR_ERROR) << " unclear_errors=" << t.count(Ending::UNCLEAR_ERROR)
     << " crashes=" << t.count(Ending::CRASH) << " hangs=" << t.count(Ending::HANG)
     << " max_exit_after_fault_s=" << quantile(t.exit_after_fault_s, 1.0) << " timeout_s=" << timeout_s
     << " slack_s=" << slack_s << std::endl;
}

bool Report::failed() const {
  return total_.count(Ending::HANG) + total_.count(Ending::UNCLEAR_ERROR) + total_.count(Ending::CRASH) > 0;
}

}  // namespace fault_soak
