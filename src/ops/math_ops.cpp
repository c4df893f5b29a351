// Reductions and normalisations over dims (PyTorch's _math_ops.py): sum, mean, amax, amin, max/min
// (with and without dim), argmax/argmin, var/std, linalg_vector_norm, softmax / log_softmax and their
// backwards.
//
// Placement algebra per mesh dim, for a reduction over dims R:
//   Shard(d), d in R  -> sum: Partial(sum); mean: Partial(avg) when the shards are even (else the dim is
//                        gathered first); amax/amin/max(): Partial(max/min); anything else (var, arg*,
//                        norms, max.dim with indices): the dim is gathered first (Replicate)
//   Shard(d), d not in R -> Shard(d renumbered without the reduced dims unless keepdim)
//   Partial(sum|avg)  -> kept by sum and mean (linear); reduced first by everything else
//   Partial(max|min)  -> kept by amax/amin (max/min over a max/min); reduced first by everything else
// softmax / log_softmax along d: Shard(d) is gathered first, Partial reduced first, other shards pass.
#include <ATen/ATen.h>

#include <cmath>

#include "dtensor/tensor/shard_layout.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/redistribute/redistribute.h"
#include "ops/loss_parallel.h"
#include "ops/strategy_utils.h"
#include "dtensor/api/dtensor_api.h"
#include "tensor/dtensor_impl.h"

namespace dtensor::ops {
namespace {

enum class Reduction { SUM, MEAN, MAX, MIN, OTHER };

std::vector<bool> reduced_dims(const OpCall& call, int dims_arg, int64_t ndim) {
  std::vector<bool> reduced(std::max<int64_t>(ndim, 1), false);
  const c10::IValue* v = dims_arg >= 0 && dims_arg < static_cast<int>(call.num_args()) ? &call.arg(dims_arg) : nullptr;
  if (!v || v->isNone() || (v->isIntList() && v->toIntVector().empty())) {
    std::fill(reduced.begin(), reduced.end(), true);  // all dims
  } else if (v->isInt()) {
    reduced[normalize_dim(v->toInt(), ndim)] = true;
  } else {
    for (int64_t d : v->toIntVector()) reduced[normalize_dim(d, ndim)] = true;
  }
  return reduced;
}

// keepdim: index of the argument, or -1 (none: dims are removed).
ShardingDecision reduction(const OpCall& call, Reduction kind, int dims_arg, int keepdim_arg, size_t num_outputs) {
  const TensorInput& self = call.tensors.at(0);
  const DTensorSpec& spec = *self.spec;
  const int64_t ndim = self.tensor.dim();
  auto reduced = reduced_dims(call, dims_arg, ndim);
  const bool keepdim = keepdim_arg >= 0 && keepdim_arg < static_cast<int>(call.num_args()) &&
                       call.arg(keepdim_arg).isBool() && call.arg(keepdim_arg).toBool();
  std::vector<int64_t> renumber(std::max<int64_t>(ndim, 1));
  int64_t next = 0;
  for (int64_t d = 0; d < ndim; ++d) renumber[d] = (reduced[d] && !keepdim) ? -1 : next++;

  Placements in = spec.placements, out = spec.placements;
  for (size_t i = 0; i < in.size(); ++i) {
    const Placement& p = spec.placements[i];
    const int64_t n = spec.mesh.size(static_cast<int64_t>(i));
    if (p.is_partial()) {
      auto op = p.reduce_op();
      bool keeps = ((kind == Reduction::SUM || kind == Reduction::MEAN) && (op == ReduceOp::SUM || op == ReduceOp::AVG)) ||
                   (kind == Reduction::MAX && op == ReduceOp::MAX) || (kind == Reduction::MIN && op == ReduceOp::MIN);
      if (!keeps) in[i] = out[i] = Replicate();
      continue;
    }
    if (!p.is_shard()) continue;
    int64_t d = p.dim();
    if (!reduced[d]) {
      out[i] = p.with_dim(renumber[d]);
      continue;
    }
    if ((kind == Reduction::MAX || kind == Reduction::MIN) && chunk_sizes(self.tensor.size(d), n).back() == 0) {
      // Some rank holds an empty shard, and max / min of nothing is an error: gather the dim instead.
      in[i] = out[i] = Replicate();
      continue;
    }
    switch (kind) {
      case Reduction::SUM: out[i] = Partial(ReduceOp::SUM); break;
      case Reduction::MAX: out[i] = Partial(ReduceOp::MAX); break;
      case Reduction::MIN: out[i] = Partial(ReduceOp::MIN); break;
      case Reduction::MEAN: {
        // The mean of shard means is the mean only when every shard has the same size, across all the mesh
        // dims that shard d.
        int64_t ways = 1;
        for (size_t j = 0; j < in.size(); ++j) {
          if (spec.placements[j].is_shard(d)) ways *= spec.mesh.size(static_cast<int64_t>(j));
        }
        if (self.tensor.size(d) % ways == 0) {
          out[i] = Partial(ReduceOp::AVG);
        } else {
          in[i] = out[i] = Replicate();
        }
        break;
      }
      case Reduction::OTHER: in[i] = out[i] = Replicate(); break;
    }
  }
  // Nested shards of a reduced dim: the partial of the inner mesh dim sits inside the outer one's; both
  // become Partial, which composes (sum of sums, max of maxes). Mean needs the outer shard even too.
  std::vector<std::optional<Placements>> inputs{in};
  for (size_t k = 1; k < call.tensors.size(); ++k) inputs.push_back(std::nullopt);
  return make_decision(call, inputs, std::vector<Placements>(num_outputs, out));
}

// Schemas: sum.dim_IntList(self, dim, keepdim, dtype); sum(self, dtype); mean.dim(self, dim, keepdim, dtype);
// amax(self, dim, keepdim); max.dim(self, dim, keepdim); max(self); argmax(self, dim, keepdim);
// var.correction(self, dim, correction, keepdim); linalg_vector_norm(self, ord, dim, keepdim, dtype).
ShardingDecision sum_dim(const OpCall& c) { return reduction(c, Reduction::SUM, 1, 2, 1); }
ShardingDecision sum_all(const OpCall& c) { return reduction(c, Reduction::SUM, -1, -1, 1); }
ShardingDecision mean_dim(const OpCall& c) { return reduction(c, Reduction::MEAN, 1, 2, 1); }
ShardingDecision mean_all(const OpCall& c) { return reduction(c, Reduction::MEAN, -1, -1, 1); }
ShardingDecision amax(const OpCall& c) { return reduction(c, Reduction::MAX, 1, 2, 1); }
ShardingDecision amin(const OpCall& c) { return reduction(c, Reduction::MIN, 1, 2, 1); }
ShardingDecision max_all(const OpCall& c) { return reduction(c, Reduction::MAX, -1, -1, 1); }
ShardingDecision min_all(const OpCall& c) { return reduction(c, Reduction::MIN, -1, -1, 1); }
ShardingDecision max_dim(const OpCall& c) { return reduction(c, Reduction::OTHER, 1, 2, 2); }  // values, indices
ShardingDecision arg_dim(const OpCall& c) { return reduction(c, Reduction::OTHER, 1, 2, 1); }
ShardingDecision var_dim(const OpCall& c) { return reduction(c, Reduction::OTHER, 1, 3, 1); }
ShardingDecision var_mean_dim(const OpCall& c) { return reduction(c, Reduction::OTHER, 1, 3, 2); }

// softmax(self, dim, ...) and backward(grad_output, output, dim, ...): every tensor input follows self.
ShardingDecision softmax_like(const OpCall& call, int dim_arg) {
  const TensorInput& first = call.tensors.at(0);
  int64_t d = normalize_dim(call.arg(dim_arg).toInt(), first.tensor.dim());
  Placements p = reduce_partials(first.spec ? first.spec->placements : replicate_all(call.mesh->ndim()));
  for (auto& x : p) {
    if (x.is_shard(d)) x = Replicate();
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) inputs.push_back(t.is_scalar() ? std::nullopt : std::optional<Placements>(p));
  return make_decision(call, inputs, {p});
}
ShardingDecision softmax(const OpCall& c) { return softmax_like(c, 1); }
ShardingDecision softmax_backward(const OpCall& c) { return softmax_like(c, 2); }

// value_selecting_reduction_backward(grad, dim, indices, sizes, keepdim): max.dim / min.dim's backward,
// scattering the gradient into zeros of the input's shape. The reduced dim was whole in the forward, and
// is whole here; sizes is global and becomes this rank's.
ShardingDecision value_selecting_backward(const OpCall& call) {
  const TensorInput& grad = call.tensors.at(0);
  auto sizes = call.arg(3).toIntVector();
  int64_t d = normalize_dim(call.arg(1).toInt(), static_cast<int64_t>(sizes.size()));
  bool keepdim = call.arg(4).toBool();
  Placements p = reduce_partials(grad.spec->placements), out = p;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!p[i].is_shard()) continue;
    if (keepdim && p[i].dim() == d) p[i] = out[i] = Replicate();
    else out[i] = p[i].with_dim(!keepdim && p[i].dim() >= d ? p[i].dim() + 1 : p[i].dim());
  }
  ShardingDecision dec = make_decision(call, {p, p}, {out});
  dec.local_int_lists.emplace_back(3, local_shard(sizes, *call.mesh, out, *call.mesh->get_coordinate()).shape);
  return dec;
}

const StrategyRegistration value_selecting_backward_rule({"aten::value_selecting_reduction_backward"}, &value_selecting_backward);
const StrategyRegistration sum_dim_rules({"aten::sum.dim_IntList", "aten::sum.IntList_out", "aten::nansum"}, &sum_dim);
const StrategyRegistration sum_all_rule({"aten::sum"}, &sum_all);
const StrategyRegistration mean_dim_rule({"aten::mean.dim"}, &mean_dim);
const StrategyRegistration mean_all_rule({"aten::mean"}, &mean_all);
const StrategyRegistration amax_rule({"aten::amax"}, &amax);
const StrategyRegistration amin_rule({"aten::amin"}, &amin);
const StrategyRegistration max_all_rule({"aten::max"}, &max_all);
const StrategyRegistration min_all_rule({"aten::min"}, &min_all);
const StrategyRegistration max_min_dim_rules({"aten::max.dim", "aten::min.dim"}, &max_dim);
const StrategyRegistration arg_reduction_rules({"aten::argmax", "aten::argmin"}, &arg_dim);
const StrategyRegistration var_std_rules({"aten::var.correction", "aten::std.correction"}, &var_dim);
const StrategyRegistration var_mean_std_mean_rules({"aten::var_mean.correction", "aten::std_mean.correction"}, &var_mean_dim);
const StrategyRegistration softmax_rule({"aten::_softmax"}, &softmax);
const StrategyRegistration softmax_backward_rule({"aten::_softmax_backward_data"}, &softmax_backward);

// log_softmax: over a sharded class dim under a LossParallelGuard, the loss-parallel kernel; else as softmax.
void log_softmax_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall call(op, stack);
  if (loss_parallel_applies(call, call.arg(1).toInt())) return loss_parallel_log_softmax(call);
  run_strategy(op, stack, &softmax);
}
void log_softmax_backward_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall call(op, stack);
  if (loss_parallel_applies(call, call.arg(2).toInt())) return loss_parallel_log_softmax_backward(call);
  run_strategy(op, stack, &softmax_backward);
}
const CustomHandlerRegistration log_softmax_rule("aten::_log_softmax", &log_softmax_handler);
const CustomHandlerRegistration log_softmax_backward_rule("aten::_log_softmax_backward_data", &log_softmax_backward_handler);

}  // namespace
}  // namespace dtensor::ops

namespace dtensor::ops {
namespace {

// Vector p-norms (norm.Scalar, norm.ScalarOpt_dim, linalg_vector_norm), PyTorch's _NormPartial: each rank
// reduces its shard to sum(|x|^p) (max |x| for p = inf), one all-reduce per mesh dim that shards a reduced
// dim adds the terms up, and the root is taken once. The result is Replicate on those mesh dims; shards of
// dims that are not reduced pass through.
void vector_norm_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall call(op, stack);
  const std::string name = op_name(op);
  const TensorInput& self = call.tensors.at(0);
  const DTensorSpec& spec = *self.spec;
  const int64_t ndim = self.tensor.dim();
  // Arguments by overload.
  double p = 2.0;
  c10::IValue dims_v;
  bool keepdim = false;
  std::optional<at::ScalarType> dtype;
  if (name == "aten::linalg_vector_norm") {  // (self, ord, dim, keepdim, *, dtype)
    p = call.arg(1).toScalar().toDouble();
    dims_v = call.arg(2);
    keepdim = call.arg(3).toBool();
    if (!call.arg(4).isNone()) dtype = static_cast<at::ScalarType>(call.arg(4).toInt());
  } else {  // norm.Scalar(self, p) / norm.ScalarOpt_dim(self, p, dim, keepdim)
    if (!call.arg(1).isNone()) p = call.arg(1).toScalar().toDouble();
    if (call.num_args() > 2) {
      dims_v = call.arg(2);
      keepdim = call.arg(3).toBool();
    }
  }
  std::vector<int64_t> dims;
  if (!dims_v.isNone() && dims_v.isIntList()) dims = dims_v.toIntVector();
  std::vector<bool> reduced(std::max<int64_t>(ndim, 1), dims.empty());
  for (int64_t d : dims) reduced[normalize_dim(d, ndim)] = true;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) dims.push_back(d);
  }

  Placements in = reduce_partials(spec.placements);
  at::Tensor x = detail::get_impl(self.tensor)->local();
  if (in != spec.placements) x = redistribute_local(x, spec, in);
  at::Tensor acc;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    at::Tensor a = dtype ? x.abs().to(*dtype) : x.abs();
    if (std::isinf(p)) acc = ndim == 0 ? a : (p > 0 ? a.amax(dims, keepdim) : a.amin(dims, keepdim));
    else if (p == 0) acc = ndim == 0 ? (a != 0).to(a.scalar_type()) : (a != 0).to(a.scalar_type()).sum(dims, keepdim);
    else acc = ndim == 0 ? a.pow(p) : a.pow(p).sum(dims, keepdim);
  }
  Placements out_p = in;
  std::vector<int64_t> renumber(std::max<int64_t>(ndim, 1));
  int64_t next = 0;
  for (int64_t d = 0; d < ndim; ++d) renumber[d] = (reduced[d] && !keepdim) ? -1 : next++;
  for (int64_t i = 0; i < spec.mesh.ndim(); ++i) {
    if (!in[i].is_shard()) continue;
    if (reduced[in[i].dim()]) {
      ReduceOp op_i = std::isinf(p) ? (p > 0 ? ReduceOp::MAX : ReduceOp::MIN) : ReduceOp::SUM;
      acc = all_reduce(acc, op_i, spec.mesh.get_group(i));
      out_p[i] = Replicate();
    } else {
      out_p[i] = in[i].with_dim(renumber[in[i].dim()]);
    }
  }
  at::Tensor result;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    result = (std::isinf(p) || p == 0 || p == 1) ? acc : acc.pow(1.0 / p);
  }
  std::vector<int64_t> shape;
  for (int64_t d = 0; d < ndim; ++d) {
    if (!reduced[d]) shape.push_back(spec.meta.shape[d]);
    else if (keepdim) shape.push_back(1);
  }
  torch::jit::drop(*stack, call.num_args());
  stack->emplace_back(detail::make_dtensor(result, DTensorSpec(spec.mesh, out_p, TensorMeta{shape, {}, result.scalar_type()})));
}

const CustomHandlerRegistration vector_norm_rules[] = {
    {"aten::norm.Scalar", &vector_norm_handler},
    {"aten::norm.ScalarOpt_dim", &vector_norm_handler},
    {"aten::linalg_vector_norm", &vector_norm_handler},
};

}  // namespace
}  // namespace dtensor::ops
