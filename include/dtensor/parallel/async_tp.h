// Async TP's fused ops (PyTorch's torch.distributed._symmetric_memory.fused_all_gather_matmul and
// fused_matmul_reduce_scatter), on the local tensors of one TP group: the collective is cut into pieces
// issued asynchronously up front, and each piece's matmul runs as soon as its piece is in (or, for the
// reduce-scatter, each piece's reduction runs while the next piece's matmul computes).
//
//   all-gather + matmul:  A = cat_r(A_r) along gather_dim (A_r: rank r's shard), and
//                         A @ B = cat_r(A_r @ B) along gather_dim   (gather_dim is not A's last dim)
//     so rank r's own piece needs no communication and goes first; the others follow in the order
//     their pieces arrive (rank + 1, rank + 2, ...). One broadcast per source rank, all issued at once in
//     rank order (every rank issues the same sequence, as one group's collectives must be).
//   matmul + reduce-scatter:  reduce_scatter(A @ B, scatter_dim) = sum_r (A @ B)_r's piece for this rank;
//     the rows of each destination's block are cut into `chunks` slices; slice j of every block is
//     multiplied, stacked [n, ...] and reduce-scattered asynchronously while slice j + 1 is multiplied.
//     Each element is still the sum over ranks in rank order, as in the unfused collective.
//
// The naive path beside each (all_gather then matmul; matmul then reduce_scatter) is the reference the
// tests compare against. Neither op records autograd here: the styles (a later step) wrap them, with the
// backward of each being the other (PyTorch's micro-pipeline pass does the same on the backward graph).
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "dtensor/mesh/process_group.h"
#include "dtensor/mesh/reduce_op.h"

namespace dtensor {

// Returns (A gathered along gather_dim, [A @ B for B in Bs]). A_shard: [..., K], each B: [K, N_i].
std::pair<at::Tensor, std::vector<at::Tensor>> fused_all_gather_matmul(const at::Tensor& A_shard,
                                                                       const std::vector<at::Tensor>& Bs,
                                                                       int64_t gather_dim, ProcessGroup& group);

// reduce_scatter(A @ B, op, scatter_dim) over `group`, pipelined in `chunks` slices per destination block.
// A: [..., K], B: [K, N]; A's scatter_dim (not its last dim) must split evenly over the group.
at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                       ProcessGroup& group, int64_t chunks = 2);

namespace reference {
// The unfused paths: one all_gather then the matmuls; the matmul then one reduce_scatter.
std::pair<at::Tensor, std::vector<at::Tensor>> all_gather_matmul(const at::Tensor& A_shard, const std::vector<at::Tensor>& Bs,
                                                                 int64_t gather_dim, ProcessGroup& group);
at::Tensor matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                 ProcessGroup& group);
}  // namespace reference

}  // namespace dtensor
