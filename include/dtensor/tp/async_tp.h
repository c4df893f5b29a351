// Async TP's fused ops (PyTorch's torch.ops.symm_mem.fused_all_gather_matmul and
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
// Both are differentiable, and the backward of each is the other (PyTorch's micro-pipeline pass fuses the
// backward graph's conjugate collectives the same way):
//   (A, Y_i) = AG(A_r), A @ B_i    dA_r = fused_matmul_reduce_scatter(cat_i dY_i, cat_i B_i^T) (+ RS(dA))
//                                  dB_i = A^T @ dY_i   (the saved gathered A; a plain matmul, not chunked)
//   Z = RS(A @ B)                  (dZ_all, dA) = fused_all_gather_matmul(dZ, {B^T}): dA; dB = A^T @ dZ_all
// The gathered A's gradient, when it is used, is one rank's contribution: it is reduce-scattered (the
// backward of an all-gather).
//
// CommDebugMode (and every comm observer) sees one event per fused op under its own name, with the bytes
// of the collective it replaces: "fused_all_gather_matmul" (this rank's shard) and
// "fused_matmul_reduce_scatter" (this rank's whole partial product); the pieces are not reported apart.
// The naive path beside each (all_gather then matmul; matmul then reduce_scatter) is the reference the
// tests compare against. The styles route sequence parallel's boundaries through these ops:
// dtensor/tp/enable_async_tp.h.
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/mesh/reduce_op.h"

namespace dtensor {

// Returns (A gathered along gather_dim, [A @ B for B in Bs]). A_shard: [..., K], each B: [K, N_i]; every
// rank's shard has this rank's shape.
std::pair<at::Tensor, std::vector<at::Tensor>> fused_all_gather_matmul(const at::Tensor& A_shard,
                                                                       const std::vector<at::Tensor>& Bs,
                                                                       int64_t gather_dim, ProcessGroup& group);
inline std::pair<at::Tensor, std::vector<at::Tensor>> fused_all_gather_matmul(const at::Tensor& A_shard,
                                                                              const std::vector<at::Tensor>& Bs,
                                                                              int64_t gather_dim, const DeviceMesh& mesh,
                                                                              int64_t mesh_dim) {
  return fused_all_gather_matmul(A_shard, Bs, gather_dim, mesh.get_group(mesh_dim));
}

// reduce_scatter(A @ B, op, scatter_dim) over `group` (op SUM or AVG), pipelined in `chunks` slices per
// destination block. A: [..., K], B: [K, N]; A's scatter_dim (not its last dim) must split evenly.
at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                       ProcessGroup& group, int64_t chunks = 2);
inline at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                              const DeviceMesh& mesh, int64_t mesh_dim, int64_t chunks = 2) {
  return fused_matmul_reduce_scatter(A, B, op, scatter_dim, mesh.get_group(mesh_dim), chunks);
}

namespace reference {
// The unfused paths: one all_gather then the matmuls; the matmul then one reduce_scatter. Differentiable
// (through the autograd collectives).
std::pair<at::Tensor, std::vector<at::Tensor>> all_gather_matmul(const at::Tensor& A_shard, const std::vector<at::Tensor>& Bs,
                                                                 int64_t gather_dim, ProcessGroup& group);
at::Tensor matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                 ProcessGroup& group);
}  // namespace reference

}  // namespace dtensor
