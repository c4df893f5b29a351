// tprun's watchdog: the launcher's side of include/dtensor/mesh/watchdog.h.
//
// Each rank gets a pipe (TPRUN_HEARTBEAT_FD); once it joins its process group the library writes a line on it
// every interval: "hb <progress> <waiting_ms> <allowance_s> <phase>". tprun reads them in its poll loop and,
// with --watchdog-timeout T (seconds, 0: off), names a rank that has sent heartbeats and then
//   - sends none for T: frozen (SIGSTOP, a debugger, stuck in the kernel or a driver);
//   - makes no progress for T plus its phase's allowance while it is not in a collective, and another rank of
//     this host has been waiting in a collective for T: a livelock or a stuck device, which its peers wait on.
// The job is then stopped (restarted with --max-restarts), as when a rank fails. A rank that never sends a
// heartbeat (a program without the library, or before it joins) is not watched. Each host's tprun watches its
// own ranks: a frozen rank is named on its host, whose failure the job watch relays to the others.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tprun {

struct Heartbeat {
  using Clock = std::chrono::steady_clock;
  int fd = -1;                  // read end of the rank's pipe; -1 once closed
  std::string buf;              // an incomplete line
  bool seen = false;            // a heartbeat arrived: the rank is watched
  Clock::time_point last;       // when the last one arrived
  Clock::time_point advanced;   // when its progress last changed
  uint64_t progress = 0;
  long waiting_ms = 0;          // blocked in a collective for this long when it was sent (0: not)
  long allowance_s = 0;
  std::string phase = "-";

  // Reads what is ready (closing fd at EOF); parses complete lines.
  void read(Clock::time_point now);
  // How long the rank has been waiting in a collective at `now` (0 if it is not).
  std::chrono::milliseconds waiting(Clock::time_point now) const;
};

struct WatchedRank {
  long global = 0;
  int pid = -1;
  const Heartbeat* hb = nullptr;
};

struct Verdict {
  long rank = -1;
  std::string why;  // a sentence naming it
};
// The first rank the watchdog must stop, and why; nullopt while all is well.
std::optional<Verdict> watchdog_verdict(const std::vector<WatchedRank>& ranks, std::chrono::milliseconds timeout,
                                            Heartbeat::Clock::time_point now);

}  // namespace tprun
