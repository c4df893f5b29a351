// Loss parallel: log_softmax and nll_loss (and their backwards) over a class dim sharded on the mesh, while
// a LossParallelGuard is alive. Outside it, or with the class dim whole, the ordinary strategies run.
//
// With the class dim c sharded (Shard(c) on mesh dims M) and everything else as it is:
//   log_softmax   m = all-reduce-max over M of the local max; s = all-reduce-sum over M of sum(exp(x - m));
//                 out = x - m - log(s)                                         -> Shard(c), like x
//   backward      grad - exp(out) * all-reduce-sum over M of sum(grad)        -> Shard(c)
//   nll_loss      the rank owning sample i's target class contributes -w[t_i] * logp[i, t_i], the others
//                 0: one all-reduce-sum over M of the per-sample values, then the reduction, replicated
//   backward      -w[t_i] * g_i at the owned target positions, 0 elsewhere      -> Shard(c)
#include <ATen/ATen.h>

#include "dtensor/tensor/shard_layout.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/ops/loss_parallel.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/api/dtensor_api.h"
#include "ops/loss_parallel.h"
#include "ops/strategy_utils.h"
#include "tensor/dtensor_impl.h"

namespace dtensor {

namespace {
thread_local bool loss_parallel_active = false;
}

LossParallelGuard::LossParallelGuard() : previous_(loss_parallel_active) { loss_parallel_active = true; }
LossParallelGuard::~LossParallelGuard() { loss_parallel_active = previous_; }
bool LossParallelGuard::active() { return loss_parallel_active; }

namespace ops {
namespace {

// Mesh dims that shard tensor dim `d` of `spec`; empty when d is whole.
std::vector<int64_t> sharding_mesh_dims(const DTensorSpec& spec, int64_t d) {
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < spec.mesh.ndim(); ++i) {
    if (spec.placements[i].is_shard(d)) dims.push_back(i);
  }
  return dims;
}

at::Tensor all_reduce_over(at::Tensor x, ReduceOp op, const DTensorSpec& spec, const std::vector<int64_t>& dims) {
  for (int64_t i : dims) x = all_reduce(x, op, spec.mesh.get_group(i));
  return x;
}

// The input's placements with Partials reduced (a Partial logit is no logit).
at::Tensor reduced_local(const TensorInput& t, Placements* placements) {
  *placements = reduce_partials(t.spec->placements);
  return redistribute_local(detail::get_impl(t.tensor)->local(), *t.spec, *placements);
}

void push_result(torch::jit::Stack* stack, size_t num_args, const at::Tensor& local, const DTensorSpec& like,
                 const Placements& placements, std::vector<int64_t> shape) {
  torch::jit::drop(*stack, num_args);
  stack->emplace_back(detail::make_dtensor(local, DTensorSpec(like.mesh, placements, TensorMeta{std::move(shape), {}, local.scalar_type()})));
}

}  // namespace

bool loss_parallel_applies(const OpCall& call, int64_t class_dim_of_first) {
  if (!LossParallelGuard::active()) return false;
  const TensorInput& first = call.tensors.at(0);
  if (!first.spec) return false;
  int64_t c = normalize_dim(class_dim_of_first, first.tensor.dim());
  return !sharding_mesh_dims(*first.spec, c).empty();
}

// _log_softmax(self, dim, half_to_float)
void loss_parallel_log_softmax(OpCall& call) {
  const TensorInput& self = call.tensors.at(0);
  int64_t c = normalize_dim(call.arg(1).toInt(), self.tensor.dim());
  Placements p;
  at::Tensor x = reduced_local(self, &p);
  auto dims = sharding_mesh_dims(*self.spec, c);
  at::AutoDispatchBelowADInplaceOrView guard;
  at::Tensor m = all_reduce_over(x.numel() ? x.amax(c, true) : at::full_like(x.sum(c, true), -INFINITY), ReduceOp::MAX,
                                 *self.spec, dims);
  at::Tensor shifted = x - m;
  at::Tensor s = all_reduce_over(shifted.exp().sum(c, true), ReduceOp::SUM, *self.spec, dims);
  push_result(call.stack, call.num_args(), shifted - s.log(), *self.spec, p, self.spec->meta.shape);
}

namespace {
// The sum over classes of the gradient the last loss-parallel nll_loss backward produced on this thread: each
// row's gradient is nonzero only at its target, so the sum is that one value, known on every rank (targets,
// weights and the incoming gradient are replicated). When log_softmax's backward then receives exactly that
// gradient (cross_entropy = log_softmax + nll_loss), it uses the known sums instead of an all-reduce
// (PyTorch's loss_parallel fuses the two backwards to the same effect). Any other gradient takes the
// all-reduce.
struct NllGradRowSums {
  at::Tensor grad_local;  // the gradient's local shard, as produced
  at::Tensor row_sums;    // [N, 1]
};
thread_local NllGradRowSums last_nll_grad;
}  // namespace

// _log_softmax_backward_data(grad_output, output, dim, input_dtype)
void loss_parallel_log_softmax_backward(OpCall& call) {
  const TensorInput& grad = call.tensors.at(0);
  const TensorInput& out = call.tensors.at(1);
  int64_t c = normalize_dim(call.arg(2).toInt(), out.tensor.dim());
  Placements p;
  at::Tensor o = reduced_local(out, &p);
  const at::Tensor& grad_local = detail::get_impl(grad.tensor)->local();
  at::Tensor g = redistribute_local(grad_local, *grad.spec, p);
  auto dims = sharding_mesh_dims(*out.spec, c);
  at::AutoDispatchBelowADInplaceOrView guard;
  NllGradRowSums known = std::move(last_nll_grad);
  last_nll_grad = {};
  at::Tensor total = known.grad_local.defined() && known.grad_local.is_same(g) && c == 1 && g.dim() == 2
                         ? known.row_sums.to(g.scalar_type())
                         : all_reduce_over(g.sum(c, true), ReduceOp::SUM, *out.spec, dims);
  push_result(call.stack, call.num_args(), g - o.exp() * total, *out.spec, p, out.spec->meta.shape);
}

namespace {
// The samples whose target class this rank owns ([class_offset, class_offset + local_classes)) and that are
// not ignored. (Bitwise ops on bools: LibTorch's C++ build has meta kernels for them, not for logical_and,
// which a plan dry run needs.)
at::Tensor owned_targets(const at::Tensor& target, int64_t class_offset, int64_t local_classes, int64_t ignore_index) {
  return (target >= class_offset).bitwise_and(target < class_offset + local_classes).bitwise_and(target != ignore_index);
}

// Per-sample -w[t] * logp[i, t] on the owning rank (0 elsewhere and for ignored samples), and the weights.
std::pair<at::Tensor, at::Tensor> picked_terms(const at::Tensor& logp, const at::Tensor& target, const at::Tensor& weight,
                                               int64_t class_offset, int64_t ignore_index) {
  const int64_t local_classes = logp.size(1);
  at::Tensor owned = owned_targets(target, class_offset, local_classes, ignore_index);
  at::Tensor local_t = (target - class_offset).masked_fill(owned.bitwise_not(), 0);
  at::Tensor picked = local_classes > 0 ? logp.gather(1, local_t.unsqueeze(1)).squeeze(1) : at::zeros(target.sizes(), logp.options());
  at::Tensor w = weight.defined() ? weight.index_select(0, target.masked_fill(target == ignore_index, 0)) : at::ones_like(picked);
  w = w.masked_fill(target == ignore_index, 0);
  return {(-picked * w).masked_fill(owned.bitwise_not(), 0), w};
}
}  // namespace

// nll_loss_forward(self [N, C], target [N], weight, reduction, ignore_index) -> (output, total_weight)
void loss_parallel_nll_forward(OpCall& call) {
  const TensorInput& self = call.tensors.at(0);
  Placements p;
  at::Tensor logp = reduced_local(self, &p);
  auto dims = sharding_mesh_dims(*self.spec, 1);
  for (int64_t i = 0; i < self.spec->mesh.ndim(); ++i) {
    if (p[i].is_shard(0)) call.fail("with loss_parallel needs the batch dim whole; redistribute the logits first");
  }
  const TensorInput* target = call.tensor_arg(1);
  at::Tensor t = target->spec ? full_tensor(target->tensor).detach() : target->tensor;
  const TensorInput* weight_in = call.tensor_arg(2);
  at::Tensor weight = weight_in ? (weight_in->spec ? full_tensor(weight_in->tensor).detach() : weight_in->tensor) : at::Tensor();
  const int64_t reduction = call.arg(3).toInt(), ignore_index = call.arg(4).toInt();
  LocalShard shard = local_shard(*self.spec);
  at::AutoDispatchBelowADInplaceOrView guard;
  auto [terms, w] = picked_terms(logp, t, weight, shard.offset[1] == self.spec->meta.shape[1] ? 0 : shard.offset[1], ignore_index);
  at::Tensor per_sample = all_reduce_over(terms, ReduceOp::SUM, *self.spec, dims);
  at::Tensor total = w.sum();
  at::Tensor out = reduction == 0 ? per_sample : reduction == 2 ? per_sample.sum() : per_sample.sum() / total;
  Placements rep = replicate_all(self.spec->mesh.ndim());
  torch::jit::drop(*call.stack, call.num_args());
  call.stack->emplace_back(detail::make_dtensor(out, DTensorSpec(self.spec->mesh, rep, TensorMeta{out.sizes().vec(), {}, out.scalar_type()})));
  call.stack->emplace_back(detail::make_dtensor(total, DTensorSpec(self.spec->mesh, rep, TensorMeta{{}, {}, total.scalar_type()})));
}

// nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)
void loss_parallel_nll_backward(OpCall& call) {
  const TensorInput& self = *call.tensor_arg(1);
  Placements p;
  at::Tensor logp = reduced_local(self, &p);
  auto full_of = [](const TensorInput* t) { return !t ? at::Tensor() : t->spec ? full_tensor(t->tensor).detach() : t->tensor; };
  at::Tensor g = full_of(call.tensor_arg(0)), t = full_of(call.tensor_arg(2)), weight = full_of(call.tensor_arg(3));
  at::Tensor total = full_of(call.tensor_arg(6));
  const int64_t reduction = call.arg(4).toInt(), ignore_index = call.arg(5).toInt();
  LocalShard shard = local_shard(*self.spec);
  const int64_t offset = shard.offset[1] == self.spec->meta.shape[1] ? 0 : shard.offset[1];
  at::AutoDispatchBelowADInplaceOrView guard;
  auto [terms, w] = picked_terms(logp, t, weight, offset, ignore_index);
  (void)terms;
  at::Tensor scale = reduction == 0 ? g : reduction == 2 ? g.expand(t.sizes()) : (g / total).expand(t.sizes());
  const int64_t local_classes = logp.size(1);
  at::Tensor owned = owned_targets(t, offset, local_classes, ignore_index);
  at::Tensor grad = at::zeros_like(logp);
  if (local_classes > 0) {
    at::Tensor local_t = (t - offset).masked_fill(owned.bitwise_not(), 0);
    at::Tensor values = (-w * scale).masked_fill(owned.bitwise_not(), 0);
    grad.scatter_(1, local_t.unsqueeze(1), values.unsqueeze(1).to(grad.scalar_type()));
  }
  last_nll_grad = {grad, (-w * scale).masked_fill(t == ignore_index, 0).unsqueeze(1)};
  push_result(call.stack, call.num_args(), grad, *self.spec, p, self.spec->meta.shape);
}

}  // namespace ops
}  // namespace dtensor
