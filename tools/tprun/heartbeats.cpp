#include "heartbeats.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <sstream>

#include "mesh/process_state.h"  // the library's one reader of /proc/<pid>/stat (plain C++)

namespace tprun {
namespace {

using std::chrono::milliseconds;

std::string seconds(milliseconds ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return text;
}

milliseconds since(Heartbeat::Clock::time_point then, Heartbeat::Clock::time_point now) {
  return std::chrono::duration_cast<milliseconds>(now - then);
}

std::string who(const WatchedRank& r) {
  return "rank " + std::to_string(r.global) + " (pid " + std::to_string(r.pid) + ")";
}

}  // namespace

void Heartbeat::read(Clock::time_point now) {
  if (fd < 0) return;
  char chunk[4096];
  const ssize_t n = ::read(fd, chunk, sizeof chunk);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) {
    close(fd);
    fd = -1;
    return;
  }
  buf.append(chunk, static_cast<size_t>(n));
  for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
    std::istringstream line(buf.substr(0, nl));
    std::string tag, name;
    uint64_t p = 0;
    long w = 0, a = 0;
    if (!(line >> tag >> p >> w >> a) || tag != "hb") continue;  // not ours: ignored
    std::getline(line >> std::ws, name);
    if (!seen || p != progress) advanced = now;
    seen = true;
    last = now;
    progress = p;
    waiting_ms = w;
    allowance_s = a;
    phase = name.empty() ? "-" : name;
  }
  if (buf.size() > 65536) buf.clear();  // no line that long is ours
}

milliseconds Heartbeat::waiting(Clock::time_point now) const {
  return waiting_ms > 0 ? milliseconds(waiting_ms) + since(last, now) : milliseconds(0);
}

std::optional<Verdict> watchdog_verdict(const std::vector<WatchedRank>& ranks, milliseconds timeout,
                                            Heartbeat::Clock::time_point now) {
  if (timeout.count() <= 0) return std::nullopt;
  for (const WatchedRank& r : ranks) {
    const Heartbeat& hb = *r.hb;
    if (!hb.seen || since(hb.last, now) <= timeout) continue;
    const auto state = dtensor::detail::process_state(r.pid);
    if (state == dtensor::detail::ProcessState::GONE) continue;  // it exited: reaping reports that
    return Verdict{r.global, who(r) + " is frozen: no heartbeat for " + seconds(since(hb.last, now)) + " (--watchdog-timeout " +
           seconds(timeout) + "; process " + dtensor::detail::describe(state) +
           (hb.phase != "-" ? "; last in phase '" + hb.phase + "'" : "") + ")"};
  }
  const WatchedRank* waiter = nullptr;
  for (const WatchedRank& r : ranks) {
    if (r.hb->seen && r.hb->waiting(now) > timeout && (!waiter || r.hb->waiting(now) > waiter->hb->waiting(now))) waiter = &r;
  }
  if (!waiter) return std::nullopt;
  for (const WatchedRank& r : ranks) {
    const Heartbeat& hb = *r.hb;
    if (&r == waiter || !hb.seen || hb.waiting_ms > 0) continue;
    const milliseconds still = since(hb.advanced, now);
    if (still <= timeout + std::chrono::seconds(hb.allowance_s)) continue;
    return Verdict{r.global, who(r) + " made no progress for " + seconds(still) + " outside any collective" +
           (hb.phase != "-" ? " (in phase '" + hb.phase + "', allowance " + std::to_string(hb.allowance_s) + " s)" : "") +
           " while " + who(*waiter) + " waited " + seconds(waiter->hb->waiting(now)) +
           " in a collective (--watchdog-timeout " + seconds(timeout) + "): a livelock, a stuck device, or a collective it never calls"};
  }
  return std::nullopt;
}

}  // namespace tprun
