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

// A loopback port the test holds for the job it launches by hand (tprun makes its own: tools/tprun/spawn.h), so
// no other process can take it between the choice and rank 0's start (the race of "bind port 0, close, pass
// the number on"). SERVED: listening; rank_env(0) hands the socket to rank 0 (DTENSOR_MASTER_LISTEN_FD), which
// serves the store on it. REFUSING: bound, never listening: connecting is refused, as to a store nobody serves.
class ReservedPort {
 public:
  enum Mode { SERVED, REFUSING };
  explicit ReservedPort(Mode mode = SERVED);
  ~ReservedPort();
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;
  int port() const { return port_; }
  // MASTER_ADDR and MASTER_PORT (and for rank 0 of a SERVED port, the socket) for a rank's environment.
  std::map<std::string, std::string> env(int rank) const;

 private:
  int fd_ = -1;
  int port_ = 0;
  Mode mode_;
};

}  // namespace dtensor::testing
