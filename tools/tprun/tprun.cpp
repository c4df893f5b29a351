// tprun: a torchrun-compatible launcher for non-Python programs
// (roughly `torchrun --no-python`), POSIX/Linux only.
//
//   tprun [options] <program> [program args...]
//
// Starts --nproc-per-node copies of <program> with the torchrun environment
// (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), relays their stdout and
// stderr line by line with a "[rank<N>]: " prefix, forwards SIGINT/SIGTERM,
// and tears the whole group down as soon as one rank fails; with --nnodes > 1, every host's ranks
// (job_watch.h: a failure on any host, or a host's tprun exiting, stops them all within a second).
//
// Exit status: the ranks' common one. 0 if every rank exited 0 (after a forwarded SIGTERM too: llama_train saved
// its checkpoint, serve drained); 2 if a rank exited 2 (a usage error) and every other exited 2 as well or was
// stopped; 1 if a rank failed otherwise (or could not be started); 128+signo if tprun was stopped by SIGINT/SIGTERM
// and a rank did not exit 0; 2 on tprun's own bad usage.
//
// A usage error is printed by rank 0 alone, but every rank finds it: the first rank to exit 2 does not stop the
// others at once. tprun waits up to 10 s for them to exit by themselves, so that rank 0's `error:` line is never cut
// off by tprun's SIGTERM, whichever rank exits first.
//
// options.h: the command line; spawn.h: signals, the rank environment, fork and exec; rank_io.h: relaying
// the ranks' output. This file: the supervisor loop.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "job_watch.h"
#include "options.h"
#include "rank_io.h"
#include "spawn.h"

namespace tprun {
namespace {

using Clock = std::chrono::steady_clock;

class Launcher {
 public:
  Launcher(const Options& o, JobWatch* watch) : opt_(o), watch_(watch) {}

  int run(const std::string& path, const StoreSocket& store) {
    for (;;) {
      run_round(path, store);
      const bool all_zero = std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) {
        return r.reaped && WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
      });
      if (stop_signal_) return all_zero && !ranks_.empty() ? 0 : 128 + stop_signal_;  // the ranks' 0, else the signal's
      if (usage_error_) {
        std::fprintf(stderr, "tprun: rank %ld exited with status 2 (a usage error)%s\n", failed_rank_,
                     usage_common_ ? ", as every rank did" : "; the other ranks were stopped");
        if (watch_) watch_->fail("host " + JobWatch::hostname() + " (node " + std::to_string(opt_.node_rank) + "): rank " +
                                 std::to_string(failed_rank_) + " exited with status 2 (a usage error)");
        return 2;  // never restarted: a bad flag stays bad
      }
      const bool failed = failed_rank_ >= 0 || spawn_failed_ || remote_failed_;
      if (!failed) {
        if (watch_) watch_->done();
        return 0;
      }
      if (opt_.restart_count >= opt_.max_restarts) return 1;
      // Every host's ranks are stopped before any host starts the next round (their store is rank 0's).
      if (watch_ && !watch_->restart_barrier(opt_.restart_count, std::chrono::seconds(120))) {
        std::fprintf(stderr, "tprun: not restarting: %s\n", watch_->failure().value_or("the hosts did not agree").c_str());
        return 1;
      }
      ++opt_.restart_count;
      std::fprintf(stderr, "tprun: restarting every rank (restart %ld of at most %ld)\n", opt_.restart_count,
                   opt_.max_restarts);
      ranks_.clear();
      stopping_ = killed_ = spawn_failed_ = remote_failed_ = usage_error_ = false;
      usage_deadline_.reset();
      failed_rank_ = -1;
    }
  }

 private:
  void run_round(const std::string& path, const StoreSocket& store) {
    ranks_.resize(static_cast<size_t>(opt_.nproc));
    for (long l = 0; l < opt_.nproc; ++l) {
      Rank& r = ranks_[static_cast<size_t>(l)];
      r.local = l;
      r.global = opt_.node_rank * opt_.nproc + l;
      if (!spawn_rank(opt_, path, store, r)) {
        ranks_.resize(static_cast<size_t>(l));  // only the ones started
        spawn_failed_ = true;
        begin_stop(SIGTERM);
        break;
      }
    }
    loop();
    if (failed_rank_ >= 0 && !usage_error_)
      std::fprintf(stderr, "tprun: stopping: rank %ld failed first\n", failed_rank_);
  }

  // Signals every rank's process group that may still have members. A group
  // whose leader was reaped can live on while its pipes are held open.
  void signal_all(int sig) {
    for (const Rank& r : ranks_)
      if (!r.reaped || r.streams_open()) kill(-r.pid, sig);
  }

  void begin_stop(int sig) {
    if (stopping_) return;
    stopping_ = true;
    kill_deadline_ = Clock::now() + grace();
    signal_all(sig);
  }

  Clock::duration grace() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(opt_.grace_seconds));
  }

  void on_exit_status(Rank& r, int status) {
    r.reaped = true;
    r.status = status;
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || stopping_) return;  // ranks we stopped ourselves are no cause
    const bool usage = WIFEXITED(status) && WEXITSTATUS(status) == 2;
    if (usage && (failed_rank_ < 0 || usage_error_)) {
      // A usage error: the others find it too (rank 0 prints it); let them exit by themselves (check_usage_wait).
      if (failed_rank_ < 0) {
        failed_rank_ = r.global;
        usage_error_ = usage_common_ = true;
        usage_deadline_ = Clock::now() + std::chrono::seconds(10);
      }
      return;
    }
    if (usage_error_) {  // another failure while waiting: a failure, not a usage error
      usage_error_ = false;
      usage_deadline_.reset();
      failed_rank_ = -1;
    }
    if (WIFSIGNALED(status))
      std::fprintf(stderr,
                   "tprun: rank %ld (local rank %ld, pid %d) was killed by signal %d (%s)\n",
                   r.global, r.local, r.pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
      std::fprintf(stderr, "tprun: rank %ld (local rank %ld, pid %d) exited with status %d\n",
                   r.global, r.local, r.pid, WEXITSTATUS(status));
    failed_rank_ = r.global;
    if (watch_) {
      const std::string how = WIFSIGNALED(status) ? "was killed by signal " + std::to_string(WTERMSIG(status))
                                                  : "exited with status " + std::to_string(WEXITSTATUS(status));
      watch_->fail("host " + JobWatch::hostname() + " (node " + std::to_string(opt_.node_rank) + "): rank " +
                   std::to_string(r.global) + " " + how);
    }
    begin_stop(SIGTERM);
  }

  // After a rank's usage error: the others that have not exited by the deadline are stopped.
  void check_usage_wait() {
    if (!usage_deadline_ || stopping_) return;
    if (all_reaped()) return;
    if (Clock::now() < *usage_deadline_) return;
    usage_common_ = false;
    if (watch_) watch_->fail("host " + JobWatch::hostname() + " (node " + std::to_string(opt_.node_rank) + "): rank " +
                             std::to_string(failed_rank_) + " exited with status 2 (a usage error)");
    begin_stop(SIGTERM);
  }

  // The watchdog (heartbeats.h): a frozen or stalled rank fails the job like a rank that exited.
  void check_heartbeats() {
    if (stopping_ || opt_.watchdog_timeout_s <= 0) return;
    std::vector<WatchedRank> watched;
    for (const Rank& r : ranks_)
      if (!r.reaped) watched.push_back({r.global, r.pid, &r.hb});
    const auto timeout = std::chrono::milliseconds(static_cast<long>(opt_.watchdog_timeout_s * 1000));
    const auto verdict = watchdog_verdict(watched, timeout, Clock::now());
    if (!verdict) return;
    std::fprintf(stderr, "tprun: watchdog: %s; stopping every rank\n", verdict->why.c_str());
    failed_rank_ = verdict->rank;
    // The named rank cannot act on SIGTERM (stopped, or stuck): SIGKILL at once, so its peers see it gone and
    // end within a poll instead of waiting out their collectives; the others get SIGTERM and the grace period.
    for (const Rank& r : ranks_)
      if (r.global == verdict->rank) kill(-r.pid, SIGKILL);
    if (watch_) {
      watch_->fail("host " + JobWatch::hostname() + " (node " + std::to_string(opt_.node_rank) + "): watchdog: " +
                   verdict->why);
    }
    begin_stop(SIGTERM);
  }

  // Another host's failure, relayed by the job watch: stop this host's ranks, naming it.
  void check_watch() {
    if (!watch_ || stopping_) return;
    if (auto failure = watch_->failure()) {
      std::fprintf(stderr, "tprun: stopping this host's ranks: the job failed first on %s\n", failure->c_str());
      remote_failed_ = true;
      begin_stop(SIGTERM);
    }
  }

  // Relays what is already buffered in r's pipes (bounded: a grandchild
  // could keep writing forever).
  void drain_ready(Rank& r) {
    for (Stream* s : {&r.out, &r.err})
      for (int i = 0; i < 64 && s->fd >= 0; ++i) {
        pollfd p{s->fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) break;
        read_stream(r, *s, opt_.prefix);
      }
  }

  void reap() {
    for (Rank& r : ranks_) {
      if (r.reaped) continue;
      int status = 0;
      pid_t p;
      do p = waitpid(r.pid, &status, WNOHANG); while (p < 0 && errno == EINTR);
      if (p == r.pid) {
        drain_ready(r);  // relay its last words before reporting its exit
        on_exit_status(r, status);
      } else if (p < 0) {
        r.reaped = true;  // ECHILD: should not happen
      }
    }
  }

  void drain_signal_pipe() {
    unsigned char sigs[64];
    ssize_t n;
    while ((n = read(signal_pipe(), sigs, sizeof sigs)) > 0 || (n < 0 && errno == EINTR)) {
      for (ssize_t i = 0; i < n; ++i) {
        int sig = sigs[i];
        if (sig != SIGINT && sig != SIGTERM) continue;  // SIGCHLD: reap() runs anyway
        if (!stop_signal_) {
          std::fprintf(stderr, "tprun: received signal %d (%s), stopping ranks\n", sig,
                       strsignal(sig));
          stop_signal_ = sig;
        }
        if (stopping_) signal_all(sig);  // forward repeats (e.g. a second ^C)
        else begin_stop(sig);
      }
    }
  }

  bool all_reaped() const {
    return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.reaped; });
  }

  void loop() {
    std::optional<Clock::time_point> drain_deadline;
    for (;;) {
      reap();
      check_usage_wait();
      check_watch();
      check_heartbeats();
      auto now = Clock::now();
      if (stopping_ && !killed_ && now >= kill_deadline_) {
        killed_ = true;
        signal_all(SIGKILL);
      }
      if (all_reaped()) {
        // Leftover grandchildren may hold a pipe open: drain for a bounded time.
        if (!drain_deadline)
          drain_deadline = now + std::clamp(grace(), Clock::duration(std::chrono::seconds(1)),
                                            Clock::duration(std::chrono::seconds(5)));
        bool open = std::any_of(ranks_.begin(), ranks_.end(),
                                [](const Rank& r) { return r.streams_open(); });
        if (!open || now >= *drain_deadline) break;
      }
      poll_once();
    }
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) close_stream(r, *s, opt_.prefix);
      if (r.hb.fd >= 0) close(r.hb.fd), r.hb.fd = -1;
    }
  }

  // Waits (at most 100 ms: SIGCHLD and deadlines are re-checked by the
  // caller) for output or signals and handles whatever is ready.
  void poll_once() {
    std::vector<pollfd> fds{{signal_pipe(), POLLIN, 0}};
    std::vector<std::pair<Rank*, Stream*>> owners{{nullptr, nullptr}};  // Stream nullptr: the heartbeat pipe
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) { fds.push_back({s->fd, POLLIN, 0}); owners.emplace_back(&r, s); }
      if (r.hb.fd >= 0) { fds.push_back({r.hb.fd, POLLIN, 0}); owners.emplace_back(&r, nullptr); }
    }
    if (poll(fds.data(), fds.size(), 100) <= 0) return;  // timeout or EINTR
    if (fds[0].revents) drain_signal_pipe();
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      if (owners[i].second) read_stream(*owners[i].first, *owners[i].second, opt_.prefix);
      else owners[i].first->hb.read(Clock::now());
    }
  }

  Options opt_;  // restart_count advances with each round
  std::vector<Rank> ranks_;
  bool stopping_ = false, killed_ = false, spawn_failed_ = false, remote_failed_ = false;
  JobWatch* watch_ = nullptr;  // with --nnodes > 1: fail fast across hosts
  int stop_signal_ = 0;
  long failed_rank_ = -1;
  bool usage_error_ = false, usage_common_ = false;  // the first failure was an exit status 2; every rank's so far
  std::optional<Clock::time_point> usage_deadline_;
  Clock::time_point kill_deadline_{};
};

}  // namespace
}  // namespace tprun

int main(int argc, char** argv) {
  // Make sure fds 0-2 exist, so no pipe we create can land on them.
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0) open("/dev/null", O_RDWR);
  tprun::Options opt = tprun::parse_args(argc, argv);
  // One host: the store's listening socket is made now (a free port for 0), and rank 0 serves on it.
  tprun::StoreSocket store;
  if (opt.nnodes == 1) {
    store = tprun::reserve_store_port(opt.master_addr, opt.master_port);
    if (store.fd < 0 && opt.master_port == 0) {
      std::fprintf(stderr, "tprun: error: --master-port 0: cannot pick a free port on %s\n", opt.master_addr.c_str());
      return 1;
    }
    if (store.fd < 0) store.port = opt.master_port;
  } else {
    store.port = opt.master_port;
  }
  const long port = store.port;
  if (opt.nproc > 1 && !std::getenv("OMP_NUM_THREADS"))
    std::fprintf(stderr, "tprun: note: setting OMP_NUM_THREADS=1 for each rank to avoid "
                         "overloading the system; tune it for your application as needed\n");
  tprun::install_signal_handlers();
  std::unique_ptr<tprun::JobWatch> watch;
  if (opt.nnodes > 1) {
    try {
      watch = std::make_unique<tprun::JobWatch>(opt, port);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tprun: %s\n", e.what());
      return 1;
    }
    opt.node_rank = watch->node_rank();
    // With restarts, node 0's go-ahead first: a host rejoining a pending restart must not start ranks that would
    // meet the old round's store. (Without, a host starts at once, as torchrun's static launch does.)
    if (opt.node_rank != 0 && opt.max_restarts > 0) {
      const auto round = watch->wait_go(std::chrono::seconds(300));
      if (!round) {
        std::fprintf(stderr, "tprun: node 0 (%s:%ld) gave no go-ahead within 300 s: %s\n", opt.master_addr.c_str(), port + 1,
                     watch->failure().value_or("no answer").c_str());
        return 1;
      }
      opt.restart_count = *round;
    }
    if (!opt.rdzv_endpoint.empty())
      std::fprintf(stderr, "tprun: rendezvous at %s: this host (%s) is node %ld of %ld\n", opt.rdzv_endpoint.c_str(),
                   tprun::JobWatch::hostname().c_str(), opt.node_rank, opt.nnodes);
  }
  // Several hosts: node 0 (known once the job watch has numbered the hosts) makes the store's socket.
  if (opt.nnodes > 1 && opt.node_rank == 0) {
    store = tprun::reserve_store_port(opt.master_addr, opt.master_port);
    store.port = opt.master_port;
  }
  tprun::Launcher launcher(opt, watch.get());
  return launcher.run(tprun::resolve_program(opt.command[0]), store);
}
