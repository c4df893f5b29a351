// The all-gather of shards whose sizes along the gathered dim may differ, once every member's size is known.
// functional all_gather and the autograd AllGatherFn share it: without sizes both learn them through
// ProcessGroup::exchange_row_counts, which also agrees on the rest of the gather (agreed = true: the padded
// payload is not checked again).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dtensor {
class ProcessGroup;

namespace detail {

// cat over group ranks of their `tensor` along dim `d` (normalized), sizes[r] being rank r's size there.
at::Tensor all_gather_sized(const at::Tensor& tensor, int64_t d, ProcessGroup& group, const std::vector<int64_t>& sizes,
                            bool agreed);

}  // namespace detail
}  // namespace dtensor
