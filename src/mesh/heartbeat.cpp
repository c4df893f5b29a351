// The heartbeat thread (include/dtensor/mesh/watchdog.h). One line per interval on the pipe tprun gave:
//   "hb <progress> <waiting_ms> <allowance_s> <phase>\n"
// progress: collectives finished (and watchdog::progress() calls); waiting_ms: how long the process has been
// blocked in a collective now (0: it is not); allowance_s and phase: the longest phase it is in ("-": none).
// A line is far below PIPE_BUF, so each write is atomic; tprun reads them in its poll loop.
#include "mesh/heartbeat.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "dtensor/core/error.h"
#include "dtensor/mesh/watchdog.h"

namespace dtensor {
namespace {

using Clock = std::chrono::steady_clock;

struct State {
  std::atomic<bool> on{false};
  std::atomic<uint64_t> progress{0};
  std::mutex mu;  // the waits and the phases
  int waiting = 0;                // collectives this process is blocked in now (threads)
  Clock::time_point waiting_since;  // of the first of them
  std::map<long, std::pair<std::string, std::chrono::seconds>> phases;
  long next_phase = 0;
};

// Never destroyed: the thread writes until the process ends, after static destructors may have run.
State& state() {
  static State* s = new State;
  return *s;
}

long parse_positive(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(text, &end, 10);
  DTENSOR_CHECK(*text != '\0' && *end == '\0' && errno == 0 && v > 0, "dtensor: environment variable ", name, "='",
                text, "' is not a positive integer");
  return v;
}

std::string line(State& s) {
  long waiting_ms = 0, allowance_s = 0;
  std::string phase = "-";
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.waiting > 0) {
      waiting_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - s.waiting_since).count();
      waiting_ms = std::max(waiting_ms, 1L);
    }
    for (const auto& [_, p] : s.phases) {
      if (p.second.count() >= allowance_s) {
        allowance_s = p.second.count();
        phase = p.first;
      }
    }
  }
  for (char& c : phase) if (c == '\n' || c == '\r') c = ' ';
  return "hb " + std::to_string(s.progress.load(std::memory_order_relaxed)) + " " + std::to_string(waiting_ms) + " " +
         std::to_string(allowance_s) + " " + phase.substr(0, 200) + "\n";
}

void beat(int fd, std::chrono::milliseconds every) {
  // A write to a pipe whose reader (tprun) is gone raises SIGPIPE: kept pending here, so write fails instead.
  sigset_t pipe_only;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, nullptr);
  State& s = state();
  for (;;) {
    const std::string text = line(s);
    const ssize_t n = write(fd, text.data(), text.size());
    if (n < 0 && errno != EAGAIN && errno != EINTR) return;  // tprun is gone: no one listens
    std::this_thread::sleep_for(every);
  }
}

}  // namespace

namespace detail {

void start_heartbeat(int rank) {
  const char* fd_text = std::getenv("TPRUN_HEARTBEAT_FD");
  if (fd_text == nullptr) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    const int fd = static_cast<int>(parse_positive("TPRUN_HEARTBEAT_FD", fd_text));
    const char* every_text = std::getenv("TPRUN_HEARTBEAT_INTERVAL_MS");
    const auto every = std::chrono::milliseconds(every_text ? parse_positive("TPRUN_HEARTBEAT_INTERVAL_MS", every_text) : 1000);
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
      std::cerr << ("dtensor: warning: rank " + std::to_string(rank) + ": TPRUN_HEARTBEAT_FD=" + fd_text +
                    " is not an open pipe (closed by a wrapper?): no heartbeats, tprun's watchdog cannot see this rank\n")
                << std::flush;
      return;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);  // not for the programs this rank may start
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    state().on = true;
    std::thread(beat, fd, every).detach();
  });
}

CollectiveWaitMark::CollectiveWaitMark() {
  State& s = state();
  if (!s.on.load(std::memory_order_relaxed)) return;
  counted_ = true;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.waiting++ == 0) s.waiting_since = Clock::now();
}

CollectiveWaitMark::~CollectiveWaitMark() {
  State& s = state();
  if (ok_) s.progress.fetch_add(1, std::memory_order_relaxed);
  if (!counted_) return;
  std::lock_guard<std::mutex> lock(s.mu);
  --s.waiting;
}

}  // namespace detail

namespace watchdog {

Phase::Phase(std::string what, std::chrono::seconds allowance) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  id_ = s.next_phase++;
  s.phases[id_] = {std::move(what), allowance};
}

Phase::~Phase() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.phases.erase(id_);
  s.progress.fetch_add(1, std::memory_order_relaxed);  // leaving a phase is progress: its allowance ends now
}

void progress() { state().progress.fetch_add(1, std::memory_order_relaxed); }

bool enabled() { return state().on.load(std::memory_order_relaxed); }

}  // namespace watchdog
}  // namespace dtensor
