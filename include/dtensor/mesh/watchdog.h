// The rank's side of tprun's watchdog (tools/tprun/heartbeats.h is the launcher's).
//
// Under tprun each rank is given a pipe (TPRUN_HEARTBEAT_FD) and, once it joins the process group, a thread
// of the library writes a heartbeat on it every interval: how many collectives this rank has finished (its
// progress), how long it has been blocked in one now, and the allowance of a long phase it is in. tprun
// names and stops a rank that
//   - sends no heartbeat for --watchdog-timeout seconds: the process is frozen (SIGSTOP, a debugger, stuck in
//     the kernel or a device driver), or
//   - makes no progress for that long (plus its phase's allowance) while it is not in a collective and
//     another rank has been waiting in one for that long: a livelock, a stuck device, a rank that will never
//     call the collective its peers wait in.
// Without tprun (no TPRUN_HEARTBEAT_FD) nothing is sent and these calls cost an atomic add.
#pragma once

#include <chrono>
#include <string>

namespace dtensor::watchdog {

// Declares a phase in which this rank may go on without collectives for up to `allowance` more than the
// watchdog's timeout (a checkpoint save, loading weights, a first compilation), as the peers wait for it.
// Phases nest (the largest allowance counts); the phase's name is reported if the rank is stopped in it.
class Phase {
 public:
  Phase(std::string what, std::chrono::seconds allowance);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  long id_;
};

// Marks progress by hand (the process group's collectives mark it themselves).
void progress();

// Whether this process sends heartbeats (it was launched by tprun with its watchdog on, and joined a group).
bool enabled();

}  // namespace dtensor::watchdog
