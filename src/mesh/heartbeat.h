// The library's hooks into the heartbeat of include/dtensor/mesh/watchdog.h.
#pragma once

namespace dtensor::detail {

// Starts the heartbeat thread when TPRUN_HEARTBEAT_FD names a pipe (once per process; later calls, and
// calls without the variable, do nothing). Throws dtensor::Error naming the variable when it is malformed.
void start_heartbeat(int rank);

// While one lives, this process is blocked in a collective (its heartbeat says since when); a successful
// one counts as progress. Nests (several threads, a collective inside a collective's wait).
class CollectiveWaitMark {
 public:
  CollectiveWaitMark();
  ~CollectiveWaitMark();
  void succeeded() { ok_ = true; }
  CollectiveWaitMark(const CollectiveWaitMark&) = delete;
  CollectiveWaitMark& operator=(const CollectiveWaitMark&) = delete;

 private:
  bool ok_ = false;
  bool counted_ = false;  // the heartbeat was on when it began
};

}  // namespace dtensor::detail
