// Waiting for a peer's counter in shared memory without burning the core the peer needs.
//
// Spin briefly (a few microseconds: the peer is usually already there), then sched_yield for a while (with
// more ranks than cores the peer needs our core), then sleep in futex_wait on the peer's counter, which the
// peer wakes when it advances and it knows someone sleeps. Every wait is bounded: past `deadline` it fails
// naming the peer; a peer whose process is gone, or that gave up on the group, fails it at once.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "mesh/shm/segment.h"

namespace dtensor::detail::shm {

// Advances `mine` to `value` and wakes peers sleeping on it.
void publish_arrival(RankControl& mine, uint32_t value);

// Why a wait ended without the peer arriving; the caller words the error.
enum class WaitFailure { NONE, TIMED_OUT, PEER_EXITED, PEER_FAILED };

// Waits until peer.arrived has reached `value` (wrapping compare). Returns NONE on success.
WaitFailure wait_for_arrival(const RankControl& peer, uint32_t value,
                             std::chrono::steady_clock::time_point deadline);

}  // namespace dtensor::detail::shm
