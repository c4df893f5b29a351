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
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dtensor {
class ProcessGroup;

namespace detail {

enum class SizedCollective : int64_t { ALL_REDUCE = 1, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, BROADCAST };

bool size_agreement_enabled();  // DTENSOR_CHECK_COLLECTIVE_SIZES, read once

// Throws dtensor::Error on every member when the members' arguments cannot make one collective. `out` may
// be undefined (all_reduce, broadcast); the splits are all_to_all's (rows of dim 0), empty otherwise.
// No-op in a group of one rank or when disabled.
void agree_on_sizes(ProcessGroup& group, SizedCollective collective, const at::Tensor& in, const at::Tensor& out,
                    const std::vector<int64_t>& in_splits = {}, const std::vector<int64_t>& out_splits = {});

}  // namespace detail
}  // namespace dtensor
