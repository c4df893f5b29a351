// Async TP's fused ops (dtensor/tp/async_tp.h): the collective in pieces issued asynchronously up
// front, the matmuls on the pieces as they arrive; each op's backward is the other.
#include "dtensor/tp/async_tp.h"

#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "dtensor/core/error.h"
#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/tensor/shard_layout.h"
#include "mesh/autograd_comm_scope.h"

namespace dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t row_dim(int64_t dim, const at::Tensor& t, const char* op) {
  const int64_t d = dim < 0 ? dim + t.dim() : dim;
  DTENSOR_CHECK(t.dim() >= 2 && d >= 0 && d < t.dim() - 1, "dtensor: ", op, ": dim ", dim, " of a ", t.dim(),
                "-d tensor is not one of its row dims (the last dim is K)");
  return d;
}

// B must be [K, N] for A [..., K].
void check_rhs(const at::Tensor& B, const at::Tensor& A, const char* op) {
  DTENSOR_CHECK(B.dim() == 2 && B.size(0) == A.size(-1), "dtensor: ", op, ": B of shape ", c10::str(B.sizes()),
                " does not multiply A of shape ", c10::str(A.sizes()), " (B is [K, N])");
}

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }

// One event for the fused op, under its own name, with the bytes of the collective it replaces; the
// pieces it issues while the returned guard lives are not reported apart.
detail::UncountedCollectivesGuard report_fused(const char* name, int64_t bytes, ProcessGroup& g) {
  if (g.size() > 1) detail::notify_comm_observers(CommEvent{name, bytes, g.size(), &g.ranks(), /*async_op=*/true});
  return {};
}

// [..., K] as [rows, K]; a copy only when `t` is not contiguous.
at::Tensor rows_of(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

// The forward kernels (no autograd).
//
// all-gather + matmul: the shards are moved row-dim first ([rows, ..., K], one copy of this rank's shard),
// so that rank r's piece is one contiguous block of the gathered buffer that a broadcast can fill in
// place and a matmul can write its product block to.
std::pair<at::Tensor, std::vector<at::Tensor>> all_gather_matmul_pipelined(const at::Tensor& A_shard,
                                                                           at::TensorList Bs, int64_t d,
                                                                           ProcessGroup& group) {
  const int n = group.size(), me = group.rank();
  const at::Tensor mine = A_shard.movedim(d, 0).contiguous();
  const int64_t rows = mine.size(0);
  std::vector<int64_t> shape = mine.sizes().vec();
  shape[0] = rows * n;
  at::Tensor gathered = at::empty(shape, mine.options());  // [n * rows, ..., K], rank r's rows at r * rows
  std::vector<at::Tensor> pieces(n);
  std::vector<Work> arrived(n);
  {
    auto uncounted = report_fused("fused_all_gather_matmul", nbytes(A_shard), group);
    for (int r = 0; r < n; ++r) {  // the same sequence of broadcasts on every rank: r = 0, 1, ...
      pieces[r] = gathered.narrow(0, r * rows, rows);
      if (r == me) pieces[r].copy_(mine);
      arrived[r] = group.broadcast_async(pieces[r], r);
    }
  }
  std::vector<at::Tensor> products;  // [n * rows, ..., N_i]
  for (const auto& B : Bs) {
    std::vector<int64_t> out_shape = shape;
    out_shape.back() = B.size(1);
    products.push_back(at::empty(out_shape, mine.options()));
  }
  for (int k = 0; k < n; ++k) {  // this rank's own piece first (no wait), then in the order they come
    const int r = (me + k) % n;
    if (r != me) arrived[r].wait();
    for (size_t i = 0; i < Bs.size(); ++i) {
      at::Tensor block = products[i].narrow(0, r * rows, rows);
      at::matmul_out(block, pieces[r], Bs[i]);
    }
  }
  arrived[me].wait();  // our own broadcast (others were reading our piece)
  std::vector<at::Tensor> outs;
  for (auto& p : products) outs.push_back(p.movedim(0, d).contiguous());
  return {gathered.movedim(0, d).contiguous(), std::move(outs)};
}

// matmul + reduce-scatter: slice j of every destination's block is multiplied, stacked [n, rows_j, ..., N]
// and reduce-scattered (each element summed over ranks in rank order, as the unfused collective sums it)
// while slice j + 1 is multiplied.
at::Tensor matmul_reduce_scatter_pipelined(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t s,
                                           ProcessGroup& group, int64_t chunks) {
  const int64_t n = group.size();
  const int64_t block = A.size(s) / n;  // rows of each destination rank's block
  const at::Tensor a = A.movedim(s, 0);
  const std::vector<int64_t> rows = chunk_sizes(block, std::min(chunks, std::max<int64_t>(block, 1)));
  std::vector<int64_t> out_shape = a.sizes().vec();
  out_shape[0] = block;
  out_shape.back() = B.size(1);
  at::Tensor out = at::empty(out_shape, A.options());  // [block, ..., N], slice j at its row offset
  std::vector<at::Tensor> inputs;
  std::vector<Work> reduced(rows.size());
  auto uncounted = report_fused("fused_matmul_reduce_scatter", nbytes(A) / A.size(-1) * B.size(1), group);
  for (size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] == 0) continue;
    const int64_t offset = chunk_offset(rows, static_cast<int64_t>(j));
    std::vector<at::Tensor> slices;
    for (int64_t dst = 0; dst < n; ++dst) slices.push_back(a.narrow(0, dst * block + offset, rows[j]));
    inputs.push_back(at::matmul(at::stack(slices, 0), B).contiguous());  // [n, rows_j, ..., N]
    // [1, rows_j, ..., N]: contiguous (a leading-dim slice), and Gloo wants out.size(0) * n == in.size(0)
    at::Tensor piece = out.narrow(0, offset, rows[j]).unsqueeze(0);
    reduced[j] = group.reduce_scatter_into_async(piece, inputs.back(), op);
  }
  for (auto& w : reduced) w.wait();
  return out.movedim(0, s).contiguous();
}

// dB for Y = A @ B: (dY^T @ A)^T over the flattened rows, the product the unfused Linear's backward
// computes for its weight (W = B^T), so the weight gradient's rounding is the same.
at::Tensor weight_side_grad(const at::Tensor& A, const at::Tensor& dY) { return rows_of(dY).t().mm(rows_of(A)).t(); }

// (A, Y_i) = (AG(A_r), AG(A_r) @ B_i). Inputs: A_r, the Bs; outputs: A, then the Y_i.
struct AllGatherMatmulFn : torch::autograd::Function<AllGatherMatmulFn> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& A_shard, at::TensorList Bs, int64_t dim,
                               ProcessGroup* g) {
    detail::save_comm_scope(ctx);
    ctx->set_materialize_grads(false);  // an output nobody read has no gradient (not zeros to reduce-scatter)
    auto [gathered, outs] = all_gather_matmul_pipelined(A_shard, Bs, dim, *g);
    variable_list saved{gathered};
    saved.insert(saved.end(), Bs.begin(), Bs.end());
    ctx->save_for_backward(saved);
    detail::save_group(ctx, *g);
    ctx->saved_data["dim"] = dim;
    variable_list result{gathered};
    result.insert(result.end(), outs.begin(), outs.end());
    return result;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& gathered = saved[0];
    const int64_t d = ctx->saved_data["dim"].toInt();
    ProcessGroup& g = detail::load_group(ctx);
    variable_list result{at::Tensor()};
    // dA = sum_i dY_i @ B_i^T = cat_i(dY_i) @ cat_i(B_i^T): Partial over ranks (each holds its columns),
    // reduce-scattered to this rank's rows, pipelined.
    std::vector<at::Tensor> dYs, Bts;
    for (size_t i = 1; i < saved.size(); ++i) {
      const at::Tensor& dY = grads[i];
      result.push_back(dY.defined() ? weight_side_grad(gathered, dY) : at::Tensor());
      if (!dY.defined()) continue;
      dYs.push_back(dY);
      Bts.push_back(saved[i].t());
    }
    at::Tensor& dA = result[0];
    if (!dYs.empty()) {
      const at::Tensor dY = dYs.size() == 1 ? dYs[0] : at::cat(dYs, -1);
      const at::Tensor Bt = Bts.size() == 1 ? Bts[0] : at::cat(Bts, 0);
      dA = matmul_reduce_scatter_pipelined(dY, Bt, ReduceOp::SUM, d, g, 2);
    }
    if (grads[0].defined()) {  // the gathered A read directly: the backward of an all-gather
      at::Tensor more = reduce_scatter(grads[0], ReduceOp::SUM, d, g);
      dA = dA.defined() ? dA + more : more;
    }
    result.push_back(at::Tensor());  // dim
    result.push_back(at::Tensor());  // group
    return result;
  }
};

// Z = RS(A @ B). Backward: (dZ gathered, dA) = fused_all_gather_matmul(dZ, {B^T}); dB = A^T @ dZ gathered.
struct MatmulReduceScatterFn : torch::autograd::Function<MatmulReduceScatterFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t dim,
                            ProcessGroup* g, int64_t chunks) {
    DTENSOR_CHECK(op == ReduceOp::SUM || op == ReduceOp::AVG,
                  "dtensor: fused_matmul_reduce_scatter supports sum and avg, not ", reduce_op_name(op));
    detail::save_comm_scope(ctx);
    ctx->save_for_backward({A, B});
    detail::save_group(ctx, *g);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["scale"] = op == ReduceOp::AVG ? 1.0 / g->size() : 1.0;
    return matmul_reduce_scatter_pipelined(A, B, op, dim, *g, chunks);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    const variable_list saved = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    at::Tensor dZ = grads[0];
    if (scale != 1.0) dZ = dZ * scale;
    const at::Tensor Bt = saved[1].t();
    auto [dZ_all, dAs] = all_gather_matmul_pipelined(dZ, at::TensorList(&Bt, 1), ctx->saved_data["dim"].toInt(),
                                                     detail::load_group(ctx));
    return {dAs[0], weight_side_grad(saved[0], dZ_all), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, std::vector<at::Tensor>> fused_all_gather_matmul(const at::Tensor& A_shard,
                                                                       const std::vector<at::Tensor>& Bs,
                                                                       int64_t gather_dim, ProcessGroup& group) {
  const int64_t d = row_dim(gather_dim, A_shard, "fused_all_gather_matmul");
  for (const auto& B : Bs) check_rhs(B, A_shard, "fused_all_gather_matmul");
  variable_list out = AllGatherMatmulFn::apply(A_shard, at::TensorList(Bs), d, &group);
  at::Tensor gathered = out[0];
  return {gathered, std::vector<at::Tensor>(out.begin() + 1, out.end())};
}

at::Tensor fused_matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                       ProcessGroup& group, int64_t chunks) {
  const int64_t s = row_dim(scatter_dim, A, "fused_matmul_reduce_scatter");
  DTENSOR_CHECK(A.size(s) % group.size() == 0, "dtensor: fused_matmul_reduce_scatter: dim ", s, " of size ",
                A.size(s), " does not split evenly over ", group.describe());
  DTENSOR_CHECK(chunks >= 1, "dtensor: fused_matmul_reduce_scatter: chunks must be >= 1");
  check_rhs(B, A, "fused_matmul_reduce_scatter");
  return MatmulReduceScatterFn::apply(A, B, op, s, &group, chunks);
}

namespace reference {

std::pair<at::Tensor, std::vector<at::Tensor>> all_gather_matmul(const at::Tensor& A_shard, const std::vector<at::Tensor>& Bs,
                                                                 int64_t gather_dim, ProcessGroup& group) {
  const int64_t d = row_dim(gather_dim, A_shard, "all_gather_matmul");
  at::Tensor a = all_gather_autograd(A_shard, d, group, std::vector<int64_t>(group.size(), A_shard.size(d)));
  std::vector<at::Tensor> outs;
  for (const auto& b : Bs) outs.push_back(at::matmul(a, b));
  return {a, std::move(outs)};
}

at::Tensor matmul_reduce_scatter(const at::Tensor& A, const at::Tensor& B, ReduceOp op, int64_t scatter_dim,
                                 ProcessGroup& group) {
  const int64_t s = row_dim(scatter_dim, A, "matmul_reduce_scatter");
  return reduce_scatter_autograd(at::matmul(A, B), op, s, group);
}

}  // namespace reference
}  // namespace dtensor
