// Functional collectives: they return new tensors and leave their inputs alone, along any tensor dim and
// with uneven per-rank sizes. Not differentiable (see autograd_collectives.h).
//
// Uneven splits follow torch.chunk: a dim of size N over n ranks gives chunks of ceil(N / n), the last ones
// shorter or empty.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/mesh/reduce_op.h"

namespace dtensor {

// Every rank's `value` in group rank order (one small all_gather): how ranks learn each other's sizes.
std::vector<int64_t> exchange_sizes(int64_t value, ProcessGroup& group);

// Every rank gets op over ranks of `tensor` (same shape everywhere). AVG is SUM / size on Gloo.
at::Tensor all_reduce(const at::Tensor& tensor, ReduceOp op, ProcessGroup& group);

// cat over group ranks of each rank's `tensor` along `gather_dim`. Sizes along that dim may differ per
// rank: pass them in `sizes` (group rank order) when known, else they are exchanged first.
at::Tensor all_gather(const at::Tensor& tensor, int64_t gather_dim, ProcessGroup& group,
                      std::optional<std::vector<int64_t>> sizes = std::nullopt);

// Reduces `tensor` (same shape everywhere) over ranks and keeps this rank's piece of `scatter_dim`: its
// torch.chunk, or its entry of `sizes` (group rank order, summing to the dim's size) when given.
at::Tensor reduce_scatter(const at::Tensor& tensor, ReduceOp op, int64_t scatter_dim, ProcessGroup& group,
                          std::optional<std::vector<int64_t>> sizes = std::nullopt);

// Splits `tensor` along `split_dim` in torch.chunk pieces (or by `split_sizes`), sends piece k to group
// rank k, and concatenates what arrives along `concat_dim` in rank order (Shard(concat_dim) ->
// Shard(split_dim) on a mesh dim). All ranks must agree on the size of `split_dim`; sizes along
// `concat_dim` may differ: pass them in `concat_sizes` (group rank order) when known, else they are
// exchanged first.
at::Tensor all_to_all(const at::Tensor& tensor, int64_t split_dim, int64_t concat_dim, ProcessGroup& group,
                      std::optional<std::vector<int64_t>> concat_sizes = std::nullopt,
                      std::optional<std::vector<int64_t>> split_sizes = std::nullopt);

// Rows (dim 0) of `tensor` go to group ranks by `in_splits` (rank order, summing to tensor.size(0)); the
// result is the rows that arrive, out_splits[k] of them from rank k, in rank order: PyTorch's
// all_to_all_single with uneven splits, the token dispatch of expert parallelism. Rank k's in_splits[r] must
// equal rank r's out_splits[k] (any may be 0).
at::Tensor all_to_all_single(const at::Tensor& tensor, const std::vector<int64_t>& out_splits,
                             const std::vector<int64_t>& in_splits, ProcessGroup& group);

// Every rank gets group rank `src`'s tensor. Other ranks' `tensor` gives only shape and dtype.
at::Tensor broadcast(const at::Tensor& tensor, int src, ProcessGroup& group);

// Group rank `src` splits its `tensor` along `dim` in torch.chunk pieces (or by `sizes`) and rank k
// receives piece k. Other ranks' `tensor` gives only the shape (any size along `dim`) and dtype.
at::Tensor scatter(const at::Tensor& tensor, int64_t dim, int src, ProcessGroup& group, int64_t dim_size,
                   std::optional<std::vector<int64_t>> sizes = std::nullopt);

// The same along a mesh dim.
inline at::Tensor all_reduce(const at::Tensor& t, ReduceOp op, const DeviceMesh& mesh, int64_t mesh_dim) {
  return all_reduce(t, op, mesh.get_group(mesh_dim));
}
inline at::Tensor all_gather(const at::Tensor& t, int64_t gather_dim, const DeviceMesh& mesh, int64_t mesh_dim,
                             std::optional<std::vector<int64_t>> sizes = std::nullopt) {
  return all_gather(t, gather_dim, mesh.get_group(mesh_dim), std::move(sizes));
}
inline at::Tensor reduce_scatter(const at::Tensor& t, ReduceOp op, int64_t scatter_dim, const DeviceMesh& mesh,
                                 int64_t mesh_dim) {
  return reduce_scatter(t, op, scatter_dim, mesh.get_group(mesh_dim));
}
inline at::Tensor all_to_all(const at::Tensor& t, int64_t split_dim, int64_t concat_dim, const DeviceMesh& mesh,
                             int64_t mesh_dim, std::optional<std::vector<int64_t>> concat_sizes = std::nullopt) {
  return all_to_all(t, split_dim, concat_dim, mesh.get_group(mesh_dim), std::move(concat_sizes));
}
inline at::Tensor broadcast(const at::Tensor& t, int src, const DeviceMesh& mesh, int64_t mesh_dim) {
  return broadcast(t, src, mesh.get_group(mesh_dim));
}

}  // namespace dtensor
