#include "mesh/process_state.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

namespace dtensor::detail {

ProcessState process_state(int pid) {
  if (pid <= 0) return ProcessState::RUNNING;
  if (kill(pid, 0) != 0 && errno == ESRCH) return ProcessState::GONE;
  // /proc/<pid>/stat: "pid (comm) S ..." — the state letter follows the last ')' (comm may hold one).
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) {
    // Either no /proc (trust kill()), or the process was reaped between kill() and the read: a zombie its
    // parent collected just now. Ask kill() again, so a peer reaped in that window is not called "running".
    return kill(pid, 0) != 0 && errno == ESRCH ? ProcessState::GONE : ProcessState::RUNNING;
  }
  const auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return ProcessState::RUNNING;
  // After the state: ppid pgrp session tty_nr tpgid flags. A process being killed closes its sockets and
  // unmaps its memory before it becomes a zombie; its flags say PF_EXITING (0x4) from the start, so a peer
  // that sees the connection drop does not find it "running".
  std::istringstream rest(line.substr(close_paren + 2));
  char state = 0;
  long ppid = 0, pgrp = 0, session = 0, tty = 0, tpgid = 0;
  unsigned long flags = 0;
  rest >> state >> ppid >> pgrp >> session >> tty >> tpgid >> flags;
  constexpr unsigned long kExiting = 0x4;  // PF_EXITING, include/linux/sched.h
  if (rest && (flags & kExiting)) return ProcessState::GONE;
  switch (state) {
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
