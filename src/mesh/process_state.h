// What became of a process on this host, by pid: the one place the library asks (the shared-memory waits
// check their peers with it, and a failed collective's error reports each member on this host with it).
#pragma once

namespace dtensor::detail {

enum class ProcessState {
  RUNNING,  // exists and is not stopped (running, sleeping or waiting on I/O)
  STOPPED,  // stopped by a signal (SIGSTOP, SIGTSTP) or a debugger
  GONE,     // no such process, or a zombie: it exited or was killed
};

// pid <= 0 (not known) counts as RUNNING: the caller cannot tell, so it must not conclude the peer died.
ProcessState process_state(int pid);

const char* describe(ProcessState state);  // "running", "stopped (SIGSTOP or a debugger)", "exited"

}  // namespace dtensor::detail
