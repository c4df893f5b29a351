#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/core/error.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/core/chunking.h"
#include "mesh/autograd_comm_scope.h"
#include "mesh/uneven_gather.h"

namespace dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

c10::IValue save_sizes(const std::vector<int64_t>& v) { return c10::IValue(v); }
std::vector<int64_t> load_sizes(AutogradContext* ctx, const char* key) { return ctx->saved_data[key].toIntVector(); }

struct AllReduceFn : torch::autograd::Function<AllReduceFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, ReduceOp op, ProcessGroup* g) {
    detail::save_comm_scope(ctx);
    ctx->saved_data["op"] = static_cast<int64_t>(op);
    ctx->saved_data["n"] = static_cast<int64_t>(g->size());
    return all_reduce(x, op, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    auto op = static_cast<ReduceOp>(ctx->saved_data["op"].toInt());
    // SUM: y = sum_r x_r and each rank's loss term reads y locally, so d(loss)/dx_r is that rank's grad.
    if (op == ReduceOp::SUM) return {grads[0], {}, {}};
    if (op == ReduceOp::AVG) return {grads[0] / ctx->saved_data["n"].toInt(), {}, {}};
    throw DTENSOR_ERROR("dtensor: all_reduce with ", reduce_op_name(op), " has no backward");
  }
};

struct AllGatherFn : torch::autograd::Function<AllGatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t dim, ProcessGroup* g,
                            std::optional<std::vector<int64_t>> sizes) {
    detail::save_comm_scope(ctx);
    // Resolve the sizes now so that the backward reduce-scatter splits the grad the same way.
    const int64_t d = dim < 0 ? dim + x.dim() : dim;
    DTENSOR_CHECK(d >= 0 && d < x.dim(), "dtensor: all_gather dim ", dim, " is out of range for a ", x.dim(),
                  "-D tensor");
    const bool agreed = !sizes;
    if (!sizes) sizes = g->exchange_row_counts(x.movedim(d, 0));
    detail::save_group(ctx, *g);
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["sizes"] = save_sizes(*sizes);
    return detail::all_gather_sized(x, d, *g, *sizes, agreed);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    // Every rank's loss reads the whole gathered tensor: this rank's input grad is the sum over ranks of
    // their grads' slices at this rank's rows.
    at::Tensor gx = reduce_scatter(grads[0], ReduceOp::SUM, ctx->saved_data["dim"].toInt(), detail::load_group(ctx),
                                   load_sizes(ctx, "sizes"));
    return {gx, {}, {}, {}};
  }
};

struct ReduceScatterFn : torch::autograd::Function<ReduceScatterFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, ReduceOp op, int64_t dim, ProcessGroup* g) {
    detail::save_comm_scope(ctx);
    DTENSOR_CHECK(op == ReduceOp::SUM || op == ReduceOp::AVG,
                  "dtensor: reduce_scatter_autograd supports sum and avg, not ", reduce_op_name(op));
    int64_t d = dim < 0 ? dim + x.dim() : dim;
    detail::save_group(ctx, *g);
    ctx->saved_data["dim"] = d;
    ctx->saved_data["sizes"] = save_sizes(chunk_sizes(x.size(d), g->size()));
    ctx->saved_data["scale"] = op == ReduceOp::AVG ? 1.0 / g->size() : 1.0;
    return reduce_scatter(x, op, d, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    at::Tensor gx = all_gather(grads[0], ctx->saved_data["dim"].toInt(), detail::load_group(ctx), load_sizes(ctx, "sizes"));
    double scale = ctx->saved_data["scale"].toDouble();
    return {scale == 1.0 ? gx : gx * scale, {}, {}, {}};
  }
};

struct AllToAllFn : torch::autograd::Function<AllToAllFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t split_dim, int64_t concat_dim,
                            ProcessGroup* g, std::optional<std::vector<int64_t>> concat_sizes) {
    detail::save_comm_scope(ctx);
    int64_t s = split_dim < 0 ? split_dim + x.dim() : split_dim;
    int64_t c = concat_dim < 0 ? concat_dim + x.dim() : concat_dim;
    if (!concat_sizes) concat_sizes = exchange_sizes(x.size(c), *g);
    auto split_sizes = chunk_sizes(x.size(s), g->size());
    detail::save_group(ctx, *g);
    ctx->saved_data["s"] = s;
    ctx->saved_data["c"] = c;
    ctx->saved_data["split_sizes"] = save_sizes(split_sizes);
    ctx->saved_data["concat_sizes"] = save_sizes(*concat_sizes);
    return all_to_all(x, s, c, *g, concat_sizes, split_sizes);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    // The reverse exchange: split the grad along concat_dim by the forward's concat sizes and gather the
    // pieces back along split_dim with the forward's split sizes.
    at::Tensor gx = all_to_all(grads[0], ctx->saved_data["c"].toInt(), ctx->saved_data["s"].toInt(), detail::load_group(ctx),
                               load_sizes(ctx, "split_sizes"), load_sizes(ctx, "concat_sizes"));
    return {gx, {}, {}, {}, {}};
  }
};

struct AllToAllSingleFn : torch::autograd::Function<AllToAllSingleFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> out_splits,
                            std::vector<int64_t> in_splits, ProcessGroup* g) {
    detail::save_comm_scope(ctx);
    detail::save_group(ctx, *g);
    ctx->saved_data["out_splits"] = save_sizes(out_splits);
    ctx->saved_data["in_splits"] = save_sizes(in_splits);
    return all_to_all_single(x, out_splits, in_splits, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    // Each row's gradient goes back to the rank it came from: the splits swapped.
    at::Tensor gx = all_to_all_single(grads[0].contiguous(), load_sizes(ctx, "in_splits"), load_sizes(ctx, "out_splits"),
                                      detail::load_group(ctx));
    return {gx, {}, {}, {}};
  }
};

struct BroadcastFn : torch::autograd::Function<BroadcastFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t src, ProcessGroup* g) {
    detail::save_comm_scope(ctx);
    detail::save_group(ctx, *g);
    ctx->saved_data["src"] = src;
    return broadcast(x, static_cast<int>(src), *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    ProcessGroup& g = detail::load_group(ctx);
    at::Tensor total = all_reduce(grads[0], ReduceOp::SUM, g);
    if (g.rank() != ctx->saved_data["src"].toInt()) total.zero_();
    return {total, {}, {}};
  }
};

}  // namespace

at::Tensor all_reduce_autograd(const at::Tensor& tensor, ReduceOp op, ProcessGroup& group) {
  return AllReduceFn::apply(tensor, op, &group);
}
at::Tensor all_gather_autograd(const at::Tensor& tensor, int64_t gather_dim, ProcessGroup& group,
                               std::optional<std::vector<int64_t>> sizes) {
  return AllGatherFn::apply(tensor, gather_dim, &group, std::move(sizes));
}
at::Tensor reduce_scatter_autograd(const at::Tensor& tensor, ReduceOp op, int64_t scatter_dim, ProcessGroup& group) {
  return ReduceScatterFn::apply(tensor, op, scatter_dim, &group);
}
at::Tensor all_to_all_autograd(const at::Tensor& tensor, int64_t split_dim, int64_t concat_dim, ProcessGroup& group,
                               std::optional<std::vector<int64_t>> concat_sizes) {
  return AllToAllFn::apply(tensor, split_dim, concat_dim, &group, std::move(concat_sizes));
}
at::Tensor all_to_all_single_autograd(const at::Tensor& tensor, const std::vector<int64_t>& out_splits,
                                      const std::vector<int64_t>& in_splits, ProcessGroup& group) {
  return AllToAllSingleFn::apply(tensor, out_splits, in_splits, &group);
}
at::Tensor broadcast_autograd(const at::Tensor& tensor, int src, ProcessGroup& group) {
  return BroadcastFn::apply(tensor, static_cast<int64_t>(src), &group);
}

}  // namespace dtensor
