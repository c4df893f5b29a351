// Async TP's fused ops (dtensor/parallel/async_tp.h): the collective in pieces issued asynchronously up
// front, the matmuls on the pieces as they arrive.
#include "dtensor/parallel/async_tp.h"

#include <c10/core/GradMode.h>

#include <string>

#include "dtensor/error.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/tensor/shard_layout.h"

namespace dtensor {
namespace {

int64_t row_dim(int64_t dim, const at::Tensor& t, const char* op) {
  const int64_t d = dim < 0 ? dim + t.dim() : dim;
  if (t.dim() < 2 || d < 0 || d >= t.dim() - 1) {
    throw dtensor::Error(std::string("dtensor: ") + op + ": dim " + std::to_string(dim) + " of a " +
                         std::to_string(t.dim()) + "-d tensor is not one of its row dims (the last dim is K)");
  }
  return d;
}

}  // namespace

std::pair<at::Tensor, std::vector<at::Tensor>> fused_all_gather_matmul(const at::Tensor& A_shard,
                                                                       const std::vector<at::Tensor>& Bs,
                                                                       int64_t gather_dim, ProcessGroup& group) {
  const int64_t d = row_dim(gather_dim, A_shard, "fused_all_gather_matmul");
  at::NoGradGuard no_grad;
  const int n = group.size(), me = group.rank();
  // Rows first: A = cat_r(A_r) along dim 0 and A @ B = cat_r(A_r @ B). Shards are equal (the sequence
  // shards of sequence parallel): each rank's piece has this rank's shape.
  at::Tensor mine = A_shard.movedim(d, 0).contiguous();
  std::vector<at::Tensor> pieces(n);
  std::vector<Work> arrived(n);
  for (int r = 0; r < n; ++r) {  // the same sequence of broadcasts on every rank: r = 0, 1, ...
    pieces[r] = r == me ? mine : at::empty_like(mine);
    arrived[r] = group.broadcast_async(pieces[r], r);
  }
  std::vector<std::vector<at::Tensor>> products(Bs.size(), std::vector<at::Tensor>(n));
  for (int k = 0; k < n; ++k) {  // this rank's own piece first (no wait), then in the order they come
    const int r = (me + k) % n;
    if (r != me) arrived[r].wait();
    for (size_t i = 0; i < Bs.size(); ++i) products[i][r] = at::matmul(pieces[r], Bs[i]);
  }
  arrived[me].wait();  // our own broadcast (others were reading `mine`)
  std::vector<at::Tensor> outs;
  for (auto& p : products) outs.push_back(at::cat(p, 0).movedim(0, d));
  return {at::cat(pieces, 0).movedim(0, d), std::move(outs)};
}

at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                       ProcessGroup& group, int64_t chunks) {
  const int64_t s = row_dim(scatter_dim, A, "fused_matmul_reduce_scatter");
  const int64_t n = group.size();
  if (A.size(s) % n != 0) {
    throw dtensor::Error("dtensor: fused_matmul_reduce_scatter: dim " + std::to_string(s) + " of size " +
                         std::to_string(A.size(s)) + " does not split evenly over " + group.describe());
  }
  if (chunks < 1) throw dtensor::Error("dtensor: fused_matmul_reduce_scatter: chunks must be >= 1");
  at::NoGradGuard no_grad;
  const int64_t block = A.size(s) / n;  // rows of each destination rank's block
  const at::Tensor a = A.movedim(s, 0);
  // Slice j of every destination's block: multiplied, stacked [n, rows_j, ..., N] and reduce-scattered
  // (each element summed over ranks in rank order, as the unfused collective sums it) while slice j + 1
  // is multiplied.
  const std::vector<int64_t> rows = chunk_sizes(block, std::min(chunks, std::max<int64_t>(block, 1)));
  std::vector<at::Tensor> inputs, outputs;
  std::vector<Work> reduced(rows.size());  // (Work moves only by assignment outside process_group.cpp)
  for (size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] == 0) continue;
    const int64_t offset = chunk_offset(rows, static_cast<int64_t>(j));
    std::vector<at::Tensor> slices;
    for (int64_t dst = 0; dst < n; ++dst) slices.push_back(a.narrow(0, dst * block + offset, rows[j]));
    at::Tensor in = at::matmul(at::stack(slices, 0), B).contiguous();  // [n, rows_j, ..., N]
    std::vector<int64_t> shape = in.sizes().vec();
    shape[0] = 1;
    at::Tensor out = at::empty(shape, in.options());
    inputs.push_back(in);
    outputs.push_back(out);
    reduced[j] = group.reduce_scatter_into_async(outputs.back(), inputs.back(), op);
  }
  for (auto& w : reduced) w.wait();
  for (auto& o : outputs) o = o.squeeze(0);
  return at::cat(outputs, 0).movedim(0, s);
}

namespace reference {

std::pair<at::Tensor, std::vector<at::Tensor>> all_gather_matmul(const at::Tensor& A_shard, const std::vector<at::Tensor>& Bs,
                                                                 int64_t gather_dim, ProcessGroup& group) {
  const int64_t d = row_dim(gather_dim, A_shard, "all_gather_matmul");
  at::NoGradGuard no_grad;
  at::Tensor a = all_gather(A_shard, d, group, std::vector<int64_t>(group.size(), A_shard.size(d)));
  std::vector<at::Tensor> outs;
  for (const auto& b : Bs) outs.push_back(at::matmul(a, b));
  return {a, std::move(outs)};
}

at::Tensor matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                 ProcessGroup& group) {
  const int64_t s = row_dim(scatter_dim, A, "matmul_reduce_scatter");
  at::NoGradGuard no_grad;
  return reduce_scatter(at::matmul(A, B), op, s, group);
}

}  // namespace reference
}  // namespace dtensor
