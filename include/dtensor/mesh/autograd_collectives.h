// Differentiable collectives, the building blocks of DTensor's redistribute. Each states its backward:
//
//   all_reduce_autograd      SUM: forward sum over ranks; backward identity (each rank's grad flows as is)
//                            AVG: forward mean;            backward grad / n.   MAX/MIN: no backward.
//   all_gather_autograd      forward gather along dim;     backward reduce_scatter(SUM) of the grad
//   reduce_scatter_autograd  forward reduce-scatter (SUM); backward all_gather of the grad
//   all_to_all_autograd      forward split_dim -> concat_dim; backward the reverse all_to_all
//   all_to_all_single_autograd  forward rows by in_splits / out_splits; backward the same with the splits swapped
//   broadcast_autograd       forward src's tensor;         backward sum of grads to src (others get zeros)
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "dtensor/mesh/process_group.h"
#include "dtensor/mesh/reduce_op.h"

namespace dtensor {

at::Tensor all_reduce_autograd(const at::Tensor& tensor, ReduceOp op, ProcessGroup& group);
at::Tensor all_gather_autograd(const at::Tensor& tensor, int64_t gather_dim, ProcessGroup& group,
                               std::optional<std::vector<int64_t>> sizes = std::nullopt);
at::Tensor reduce_scatter_autograd(const at::Tensor& tensor, ReduceOp op, int64_t scatter_dim,
                                   ProcessGroup& group);
at::Tensor all_to_all_autograd(const at::Tensor& tensor, int64_t split_dim, int64_t concat_dim,
                               ProcessGroup& group, std::optional<std::vector<int64_t>> concat_sizes = std::nullopt);
at::Tensor all_to_all_single_autograd(const at::Tensor& tensor, const std::vector<int64_t>& out_splits,
                                      const std::vector<int64_t>& in_splits, ProcessGroup& group);
at::Tensor broadcast_autograd(const at::Tensor& tensor, int src, ProcessGroup& group);

}  // namespace dtensor
