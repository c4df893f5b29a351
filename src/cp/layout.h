// The load-balanced layout of context parallelism (context_parallel.h), one home for the shards and ring attention.
#pragma once

#include <cstdint>
#include <vector>

namespace dtensor::cp::internal {

// The chunks of the sequence rank r holds, in order: r and 2 * cp - 1 - r of 2 * cp (load balancing), else r of cp.
inline std::vector<int64_t> chunks_of(int64_t r, int64_t cp, bool load_balance) {
  return load_balance ? std::vector<int64_t>{r, 2 * cp - 1 - r} : std::vector<int64_t>{r};
}

}  // namespace dtensor::cp::internal
