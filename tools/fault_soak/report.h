// The soak's tally: per phase the fault landed in, how the survivors ended and how long after the fault;
// per configuration (world, launch, backend, signal) the same in brief; and the closing summary line.
#pragma once

#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "trial.h"

namespace fault_soak {

struct Tally {
  int trials = 0, setup_errors = 0;
  std::map<Ending, int> endings;
  std::vector<double> exit_after_fault_s;  // survivors that ended after the fault (not OK-before-it)
  void add(const TrialResult& r);
  int count(Ending e) const;
};

class Report {
 public:
  void add(const TrialResult& r);
  void print(std::ostream& os, double timeout_s, double slack_s) const;
  bool failed() const;  // any hang, unclear error or crash
  const Tally& total() const { return total_; }

 private:
  std::map<std::string, Tally> by_phase_, by_config_;
  Tally total_;
};

}  // namespace fault_soak
