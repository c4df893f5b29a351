#include "mesh/process_state.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace dtensor::detail {

ProcessState process_state(int pid) {
  if (pid <= 0) return ProcessState::RUNNING;
  if (kill(pid, 0) != 0 && errno == ESRCH) return ProcessState::GONE;
  // /proc/<pid>/stat: "pid (comm) S ..." — the state letter follows the last ')' (comm may hold one).
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return ProcessState::RUNNING;  // no /proc: trust kill()
  const auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return ProcessState::RUNNING;
  switch (line[close_paren + 2]) {
    case 'Z': case 'X': return ProcessState::GONE;
    case 'T': case 't': return ProcessState::STOPPED;
    default: return ProcessState::RUNNING;
  }
}

const char* describe(ProcessState state) {
  switch (state) {
    case ProcessState::RUNNING: return "running";
    case ProcessState::STOPPED: return "stopped (SIGSTOP or a debugger)";
    case ProcessState::GONE: return "exited";
  }
  return "unknown";
}

}  // namespace dtensor::detail
