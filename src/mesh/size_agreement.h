// Size agreement before a collective reaches Gloo.
//
// Gloo cannot report ranks that disagree on a collective's sizes: when a peer sends more bytes than a rank
// posted, gloo's transport thread throws gloo::EnforceNotMet ("Received data size doesn't match expected
// size") where nothing can catch it, and the process dies in std::terminate; when a peer sends fewer, the
// rank silently keeps garbage. So before each sized collective the members exchange a fixed-size
// descriptor (which collective, dtype, bytes, shape, all-to-all splits) in one small all-gather, and
// every rank of a group that disagrees throws the same dtensor::Error naming the collective, the group and
// each rank's sizes, before any payload moves.
//
// On by default; DTENSOR_CHECK_COLLECTIVE_SIZES=0 turns it off (one small all-gather saved per collective,
// at the risk above). The exchange is not a collective of the program's: comm observers do not see it.
//
// The same-host shared-memory backend (shm/shm_backend.h) checks in band instead: each rank publishes the
// same descriptor in its slot header as part of the collective itself and every rank runs the same
// comparison (check_descriptors), so no extra collective is paid; agree_on_sizes is a no-op on its groups.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor {
class ProcessGroup;

namespace detail {

// ALL_GATHER_ROWS: the exchange before an all-gather of rows (dim 0) whose counts may differ by rank
// (ProcessGroup::exchange_row_counts): same dtype, same dims after the first.
enum class SizedCollective : int64_t {
  ALL_REDUCE = 1, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST, BARRIER, ALL_GATHER_ROWS
};

bool size_agreement_enabled();  // DTENSOR_CHECK_COLLECTIVE_SIZES, read once
// Whether a collective of `group` on `in` needs the out-of-band exchange (agree_on_sizes): not in a group of
// one, not when disabled, not where the backend checks in band (shared memory, CPU tensors), not on a failed
// group (the collective itself refuses to start).
bool needs_size_agreement(const ProcessGroup& group, const at::Tensor& in);

// Throws dtensor::Error on every member when the members' arguments cannot make one collective. `out` may
// be undefined (all_reduce, broadcast); the splits are all_to_all's (rows of dim 0), empty otherwise.
// No-op in a group of one rank or when disabled.
void agree_on_sizes(ProcessGroup& group, SizedCollective collective, const at::Tensor& in, const at::Tensor& out,
                    const std::vector<int64_t>& in_splits = {}, const std::vector<int64_t>& out_splits = {});

// Where a descriptor's all_to_all splits start: in_splits[j] at kDescriptorSplitsAt + j, out_splits[j] at
// kDescriptorSplitsAt + n + j.
constexpr int64_t kDescriptorSplitsAt = 11;

// One rank's descriptor, int64[descriptor_length(n)]: what every rank must agree on for one collective.
int64_t descriptor_length(int64_t group_size);
std::vector<int64_t> size_descriptor(SizedCollective collective, const at::Tensor& in, const at::Tensor& out,
                                     const std::vector<int64_t>& in_splits, const std::vector<int64_t>& out_splits,
                                     int64_t group_size);
// Throws the mismatch error on every rank that sees the same rows. `what` is "all_reduce on group [0, 1]
// (rank 0 of 2)"; rows[r] is group rank r's descriptor; global_ranks names them.
void check_descriptors(const std::string& what, const std::vector<int>& global_ranks,
                       const std::vector<const int64_t*>& rows);

}  // namespace detail
}  // namespace dtensor
