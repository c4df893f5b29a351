// Rendezvous over a c10d store: connect (rank 0 serves), announce, wait for everyone, report who is missing.
//
// Keys under "dtensor/rdzv/": "joined" counts the ranks that announced themselves (Store::add), and
// "rank/<r>" is set by rank r, so a waiting rank can tell which ranks are still missing.
#include "mesh/rendezvous.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/mesh/launch_env.h"
#include "mesh/deadline.h"
#include "mesh/group_text.h"

namespace dtensor::detail {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

const std::string kJoined = "dtensor/rdzv/joined";
std::string rank_key(int r) { return "dtensor/rdzv/rank/" + std::to_string(r); }

std::string list(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::string seconds(milliseconds ms) {
  std::ostringstream os;
  os << static_cast<double>(ms.count()) / 1000.0 << " s";
  return os.str();
}

// Prints `line()` on stderr at the report times until destroyed, from its own thread (for waits that
// block inside c10d, where no loop of ours runs).
class BackgroundWaitReporter {
 public:
  BackgroundWaitReporter(milliseconds timeout, std::function<std::string(milliseconds)> line)
      : thread_([this, timeout, line = std::move(line)] {
          auto start = Clock::now();
          auto next = first_wait_report(timeout);
          std::unique_lock<std::mutex> lock(mutex_);
          while (!done_) {
            if (cv_.wait_until(lock, start + next, [this] { return done_; })) break;
            std::cerr << (line(next) + "\n") << std::flush;  // one write: other ranks' threads print too
            next += kWaitReportEvery;
          }
        }) {}
  ~BackgroundWaitReporter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// Which ranks have set their key (asked only when reporting or failing: one store round trip per rank).
std::pair<std::vector<int>, std::vector<int>> joined_and_missing(c10d::Store& store, int world_size) {
  std::vector<int> joined, missing;
  for (int r = 0; r < world_size; ++r) (store.check({rank_key(r)}) ? joined : missing).push_back(r);
  return {joined, missing};
}

}  // namespace

milliseconds first_wait_report(milliseconds timeout) {
  return std::min(milliseconds(5000), std::max(milliseconds(1), timeout / 2));
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnv& env, milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(env.master_port);
  options.isServer = env.rank == 0;
  options.numWorkers = env.world_size;
  options.waitWorkers = false;  // wait_for_all_ranks waits, and says for whom
  options.timeout = timeout;
  if (env.rank == 0 && env.master_listen_fd >= 0) options.masterListenFd = env.master_listen_fd;  // the launcher's
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  try {
    // Rank 0 binds at once; the others retry connecting until rank 0 serves, which they report.
    std::unique_ptr<BackgroundWaitReporter> reporter;
    if (env.rank != 0) {
      reporter = std::make_unique<BackgroundWaitReporter>(timeout, [&](milliseconds waited) {
        return "dtensor: rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
               " waiting for the rendezvous store at " + where + " (served by rank 0, not reachable yet; " +
               seconds(waited) + " of " + seconds(timeout) + ")";
      });
    }
    if (env.rank == 0) return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
    // c10d retries connecting until `timeout`, but its first query after connecting (validate, ping) reads
    // the reply with no deadline of its own: a rank 0 frozen after binding (SIGSTOP: the kernel still
    // accepts connections) would hold us forever. So the connection is made under a deadline; past it the
    // helper is abandoned with its half-made client.
    auto made = std::make_shared<c10::intrusive_ptr<c10d::Store>>();
    const std::string addr = env.master_addr;
    const auto bound = timeout + std::chrono::milliseconds(1000);
    if (!finish_within(bound, [made, addr, options] { *made = c10::make_intrusive<c10d::TCPStore>(addr, options); })) {
      throw DTENSOR_ERROR("dtensor: rank ", env.rank, " of ", env.world_size, " could not rendezvous at ", where,
                          " within ", bound.count(),
                          " ms: the store served by rank 0 did not answer (rank 0 not started yet, frozen or overloaded?)");
    }
    return *made;
  } catch (const dtensor::Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string msg = message_of(e);
    if (env.rank == 0 && (msg.find("in use") != std::string::npos || msg.find("EADDRINUSE") != std::string::npos)) {
      throw DTENSOR_ERROR("dtensor: rank 0 cannot serve the rendezvous store on ", where,
                          ": the port is already in use (another job? choose another MASTER_PORT / "
                          "--master-port): ", msg);
    }
    throw DTENSOR_ERROR("dtensor: rank ", env.rank, " of ", env.world_size, " could not rendezvous at ", where,
                        " within ", timeout.count(),
                        " ms: the store served by rank 0 was not reachable (did rank 0 start?): ", msg);
  }
}

void wait_for_all_ranks(c10d::Store& store, int rank, int world_size, milliseconds timeout,
                        const std::string& where) {
  const std::string who = "rank " + std::to_string(rank) + " of " + std::to_string(world_size);
  try {
    store.set(rank_key(rank), std::vector<uint8_t>{1});
    store.add(kJoined, 1);
    const auto start = Clock::now();
    auto next_report = first_wait_report(timeout);
    auto poll = milliseconds(10);
    while (store.add(kJoined, 0) < world_size) {
      auto waited = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
      if (waited >= timeout) {
        auto [joined, missing] = joined_and_missing(store, world_size);
        throw DTENSOR_ERROR("dtensor: ", who, " could not rendezvous at ", where, " within ", timeout.count(),
                            " ms: ranks ", list(missing), " never joined (joined: ", list(joined),
                            "; did they start, with the same MASTER_ADDR and MASTER_PORT?)");
      }
      if (waited >= next_report) {
        auto [joined, missing] = joined_and_missing(store, world_size);
        // One write per line: rank threads of one process report at the same moments.
        std::cerr << ("dtensor: " + who + " waiting at " + where + " for ranks " + list(missing) + " to join (joined: " +
                      list(joined) + "; " + seconds(next_report) + " of " + seconds(timeout) + ")\n")
                  << std::flush;
        next_report += kWaitReportEvery;
      }
      std::this_thread::sleep_for(std::min(poll, timeout - waited));
      poll = std::min(poll * 2, milliseconds(200));
    }
  } catch (const dtensor::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: ", who, " lost the rendezvous store at ", where, ": ", message_of(e));
  }
}

}  // namespace dtensor::detail
