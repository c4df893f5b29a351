// One fault-injection trial: start a small job (soak_worker ranks, by hand or under tprun), kill or freeze
// one rank at a chosen moment, and watch how the others end: on their own, with a clear error, within the
// timeout — or not (a hang, which the trial ends with SIGKILL).
#pragma once

#include <string>
#include <vector>

namespace fault_soak {

// Where in a job's life a fault can be aimed (soak_worker announces these phases), plus "random": a moment
// drawn uniformly over the job's whole life, whatever phase it falls in.
const std::vector<std::string>& phases();

struct TrialSpec {
  int index = 0;
  int world = 2;
  bool under_tprun = false;   // false: the ranks are started by hand (the soak forks each with its env)
  std::string backend;        // DTENSOR_BACKEND: "shm" (same-host collectives) or "gloo"
  int signal = 9;             // SIGKILL or SIGSTOP
  std::string aim;            // a phase of phases(), or "random"
  int victim = 0;             // the rank that gets the signal
  double delay_s = 0;         // after the aimed phase begins (or after the job starts, for "random")
};

struct Settings {
  std::string worker;         // path of soak_worker
  std::string tprun;          // path of tprun
  double timeout_s = 3;       // DTENSOR_TIMEOUT_SEC of the job
  double slack_s = 5;         // a survivor running timeout + slack after the later of the fault and its
                              // latest phase marker is a hang
};

// How one survivor (a rank started by hand, or the tprun launcher with its ranks) ended.
enum class Ending { OK, CLEAR_ERROR, UNCLEAR_ERROR, CRASH, HANG };
const char* ending_name(Ending e);

struct Survivor {
  Ending ending = Ending::OK;
  double exit_after_fault_s = 0;  // from the signal to its exit (0 when it ended before the fault)
  std::string error_line;         // its first error line, for the report's examples
};

struct TrialResult {
  TrialSpec spec;
  bool injected = false;          // false: the victim finished before its moment came
  std::string phase_hit;          // the victim's phase when the signal came ("exited" when not injected)
  std::vector<Survivor> survivors;
  std::string setup_error;        // non-empty: the trial could not run (spawn failure)
};

TrialResult run_trial(const TrialSpec& spec, const Settings& settings);

// One line for a trial: spec, where the fault landed and how each survivor ended.
std::string describe(const TrialResult& result);

}  // namespace fault_soak
