// Bounding what c10d and Gloo cannot bound themselves. Most blocking points of the library carry the job's
// timeout down to c10d (store ops, Gloo's connect and collectives, Work::wait, the shm backend's waits);
// the few that cannot — a diagnostic store query against a frozen store, tearing down a backend whose
// worker threads still wait on a frozen peer — run here on a helper thread under a deadline. Past the
// deadline the helper is abandoned (detached, with whatever it holds: a deliberate leak that the OS reclaims
// at exit) and the caller goes on. docs/design/fault_tolerance.md lists every blocking point.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Backend;
}

namespace dtensor::detail {

// Runs `fn` and returns true when it finished (rethrowing what it threw) within `limit`; false when it did
// not, in which case `fn` goes on running on an abandoned thread (so it must own what it uses). A process
// that exits while an abandoned helper is still blocked ends with _Exit(1) after saying so on stderr, before
// any static destructor runs.
bool finish_within(std::chrono::milliseconds limit, std::function<void()> fn);

// Keeps `backend` alive until the process ends, so that its destructor (which joins worker threads that may
// still wait on a dead or frozen peer) never runs. For backends of a group that failed.
void leak_deliberately(c10::intrusive_ptr<c10d::Backend> backend);

}  // namespace dtensor::detail
