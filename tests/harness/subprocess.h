// Running the project's programs from tests: capture output and exit status, with a bound on the run.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dtensor::testing {

struct ProcessResult {
  int exit_code = -1;      // exit status, or 128 + signal
  std::string output;      // stdout and stderr interleaved
  bool timed_out = false;  // killed by the bound
};

// Runs argv with the current environment plus `env` (a value "" unsets the variable), killing it after
// `timeout_seconds`.
ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                          double timeout_seconds = 120);

// Starts argv in the background (same env rules); wait_process collects it.
int start_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& output_file);
ProcessResult wait_process(int pid, const std::string& output_file, double timeout_seconds);

// Processes start_process (and run_process) started so far in this process.
int64_t processes_started();

std::string bin_path(const std::string& program);  // build/bin/<program>
int free_port();                                   // a port free on 127.0.0.1 right now

}  // namespace dtensor::testing
