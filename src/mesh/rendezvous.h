// Rendezvous: reaching the store and waiting until every rank of the job has announced itself on it.
// A job whose peer never arrives must not wait its whole timeout in silence: while waiting, each rank
// reports on stderr (first after min(5 s, timeout / 2), then every 30 s) where it waits and for whom, as
// torchrun's agents do, and it fails naming the ranks that never came.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class Store;
}

namespace dtensor {
struct LaunchEnv;

namespace detail {

// Rank 0 serves a c10d::TCPStore on MASTER_ADDR:MASTER_PORT; every rank connects to it. A connection that
// does not come within `timeout` fails naming the address (and a busy port names itself).
c10::intrusive_ptr<c10d::Store> connect_store(const LaunchEnv& env, std::chrono::milliseconds timeout);

// Announces `rank` on `store`, then waits until all `world_size` ranks have. `where` names the store in
// messages ("127.0.0.1:29500"). Throws dtensor::Error listing the ranks that did not join within `timeout`.
void wait_for_all_ranks(c10d::Store& store, int rank, int world_size, std::chrono::milliseconds timeout,
                        const std::string& where);

// When to report a wait that is still going on: after min(5 s, timeout / 2), then every 30 s.
std::chrono::milliseconds first_wait_report(std::chrono::milliseconds timeout);
constexpr std::chrono::milliseconds kWaitReportEvery{30000};

}  // namespace detail
}  // namespace dtensor
