// Neural-network ops (PyTorch's _math_ops.py norms, _matrix_ops.py attention, _embedding_ops.py, loss):
// layer norm, scaled dot-product attention (CPU flash kernel), nll_loss, embedding.
//
// Placement algebra per mesh dim:
//   native_layer_norm       input Shard(d) outside the normalized dims -> out, mean, rstd Shard(d);
//                           normalized dims gathered first; weight, bias Replicate
//   ..._backward            grad_input Shard(d); grad_weight, grad_bias Partial(sum) (sums over the batch)
//   sdpa (flash, CPU)       q, k, v Shard(1) (heads) -> out, logsumexp Shard(1); Shard(0) (batch) likewise;
//                           the sequence and head dims are gathered first; the mask Replicate
//   nll_loss_forward        batch-sharded (Shard(0)) input and target: 'none' -> Shard(0), 'sum' -> Partial,
//                           'mean' -> Partial(sum) of local sums / the global weight total (one all-reduce
//                           of the total); the class dim is gathered first (loss_parallel shards it)
//   nll_loss_backward       follows the input; total_weight and the incoming grad Replicate
//   embedding               weight Shard(1) -> out Shard(-1); indices Shard(k) -> out Shard(k); weight
//                           Shard(0) (vocab): each rank looks up the ids it owns, zeros elsewhere ->
//                           Partial(sum) (PyTorch's _MaskPartial)
//   embedding_dense_backward grad Shard(-1) -> weight grad Shard(1); grad and ids Shard(k) -> Partial(sum)
#include <ATen/ATen.h>

#include "dtensor/tensor/shard_layout.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/ops/loss_parallel.h"
#include "ops/loss_parallel.h"
#include "ops/strategy_utils.h"
#include "tensor/dtensor_impl.h"

namespace dtensor::ops {
namespace {

std::optional<Placements> placements_or_null(const TensorInput& t, const Placements& p) {
  return t.is_scalar() ? std::nullopt : std::optional<Placements>(p);
}

// --- layer norm --------------------------------------------------------------------------------------

ShardingDecision layer_norm(const OpCall& call) {
  const TensorInput& input = call.tensors.at(0);
  int64_t normalized = static_cast<int64_t>(call.arg(1).toIntVector().size());
  int64_t first_normalized = input.tensor.dim() - normalized;
  Placements p = reduce_partials(input.spec ? input.spec->placements : replicate_all(call.mesh->ndim()));
  for (auto& x : p) {
    if (x.is_shard() && x.dim() >= first_normalized) x = Replicate();
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    inputs.push_back(t.arg == 0 ? std::optional<Placements>(p) : placements_or_null(t, replicate_all(call.mesh->ndim())));
  }
  ShardingDecision d = make_decision(call, inputs, {p, p, p});
  // out: the input's shape; mean, rstd: with the normalized dims as 1 (no C++ meta kernel).
  std::vector<int64_t> stats = input.tensor.sizes().vec();
  for (int64_t k = first_normalized; k < input.tensor.dim(); ++k) stats[k] = 1;
  d.output_shapes = {input.tensor.sizes().vec(), stats, stats};
  return d;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
ShardingDecision layer_norm_backward(const OpCall& call) {
  const TensorInput& input = *call.tensor_arg(1);
  int64_t normalized = static_cast<int64_t>(call.arg(2).toIntVector().size());
  int64_t first_normalized = input.tensor.dim() - normalized;
  Placements p = reduce_partials(input.spec ? input.spec->placements : replicate_all(call.mesh->ndim()));
  Placements params = replicate_all(call.mesh->ndim());
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].is_shard() && p[i].dim() >= first_normalized) p[i] = Replicate();
    if (p[i].is_shard()) params[i] = Partial();  // weight/bias grads sum over the sharded batch
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    bool activation = t.arg == 0 || t.arg == 1 || t.arg == 3 || t.arg == 4;
    inputs.push_back(placements_or_null(t, activation ? p : replicate_all(call.mesh->ndim())));
  }
  ShardingDecision d = make_decision(call, inputs, {p, params, params});
  const TensorInput* weight = call.tensor_arg(5);
  const TensorInput* bias = call.tensor_arg(6);
  d.output_shapes = {input.tensor.sizes().vec(), weight ? weight->tensor.sizes().vec() : std::vector<int64_t>{0},
                     bias ? bias->tensor.sizes().vec() : std::vector<int64_t>{0}};
  return d;
}

// --- attention ---------------------------------------------------------------------------------------

// _scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, *, attn_mask, scale)
//   -> (output, logsumexp); backward(grad_out, query, key, value, out, logsumexp, ...) -> (dq, dk, dv)
// CUDA's fp32 kernel: _scaled_dot_product_efficient_attention(query, key, value, attn_bias, compute_log_sumexp,
//   dropout_p, is_causal, *, scale) -> (output, log_sumexp, philox_seed, philox_offset); its backward(grad_out_,
//   query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset, ...) -> (dq, dk, dv, d_bias).
// Attention is independent per (batch, head): the activations keep Shard(0) / Shard(1) and every output of
// their shape follows; sequence and head_dim shards are gathered. The RNG state outputs are Replicate.
ShardingDecision sdpa(const OpCall& call, size_t num_outputs, int num_activation_args, size_t num_replicated_outputs = 0) {
  const bool backward = call.op.schema().arguments()[0].name().rfind("grad_out", 0) == 0;
  const TensorInput& q = call.tensors.at(backward ? 1 : 0);
  Placements p = reduce_partials(q.spec ? q.spec->placements : replicate_all(call.mesh->ndim()));
  for (auto& x : p) {
    if (x.is_shard() && x.dim() >= 2) x = Replicate();  // sequence / head_dim: whole
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    bool activation = t.arg < num_activation_args;
    inputs.push_back(placements_or_null(t, activation ? p : replicate_all(call.mesh->ndim())));
  }
  std::vector<Placements> outputs(num_outputs - num_replicated_outputs, p);
  outputs.resize(num_outputs, replicate_all(call.mesh->ndim()));
  return make_decision(call, inputs, outputs);
}
ShardingDecision sdpa_forward(const OpCall& c) { return sdpa(c, 2, 3); }
ShardingDecision sdpa_backward(const OpCall& c) { return sdpa(c, 3, 6); }
ShardingDecision efficient_attention(const OpCall& c) { return sdpa(c, 4, 4, 2); }
ShardingDecision efficient_attention_backward(const OpCall& c) { return sdpa(c, 4, 7); }

// _fused_sdp_choice returns an int: run it on the locals, nothing to wrap. Meta locals (a plan dry run)
// would get the meta device's answer (the math path); they ask the CPU instead, with CPU stand-ins of the
// same shapes (allocated, never written), so that the dry run takes the kernels a real CPU run takes.
void fused_sdp_choice(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  std::vector<at::Tensor> locals;
  auto on_cpu = [](const at::Tensor& t) {
    return t.is_meta() ? at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kCPU)) : t;
  };
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor()) continue;
    if (is_dtensor(v.toTensor())) locals.push_back(on_cpu(detail::local_tensor(v.toTensor())));
    else v = on_cpu(v.toTensor());  // a plain mask
  }
  call_local(op, stack, &locals);
}

// --- nll loss ----------------------------------------------------------------------------------------

// nll_loss_forward(self, target, weight, reduction, ignore_index) -> (output, total_weight)
ShardingDecision nll_loss_strategy(const OpCall& call) {
  const TensorInput& self = call.tensors.at(0);
  int64_t reduction = call.arg(3).toInt();  // 0 none, 1 mean, 2 sum
  Placements p = reduce_partials(self.spec ? self.spec->placements : replicate_all(call.mesh->ndim()));
  Placements out = p, total = replicate_all(call.mesh->ndim());
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i].is_shard(0) && self.tensor.dim() == 2) {
      if (reduction != 0) {
        out[i] = Partial();
        total[i] = Partial();
      }
    } else if (p[i].is_shard()) {
      p[i] = out[i] = Replicate();  // the class dim (or a 1-d input) whole
    }
  }
  Placements target_p = p;
  for (auto& x : target_p) {
    if (x.is_shard() && x.dim() != 0) x = Replicate();
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    if (t.arg == 0) inputs.push_back(p);
    else if (t.arg == 1) inputs.push_back(placements_or_null(t, target_p));  // target: batch like self
    else inputs.push_back(placements_or_null(t, replicate_all(call.mesh->ndim())));
  }
  return make_decision(call, inputs, {out, total});
}

void nll_loss_forward(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall call(op, stack);
  if (call.tensors.at(0).tensor.dim() == 2 && loss_parallel_applies(call, 1)) return loss_parallel_nll_forward(call);
  const int64_t reduction = call.arg(3).toInt();
  const TensorInput& self = call.tensors.at(0);
  // 'mean' over a sharded batch is sum / total weight over all ranks: compute the local sum and weight,
  // add up the weights (one small all-reduce per sharded mesh dim), divide: a Partial(sum) of the mean.
  bool sharded_batch = false;
  if (self.spec && self.tensor.dim() == 2) {
    for (const auto& p : self.spec->placements) sharded_batch = sharded_batch || p.is_shard(0);
  }
  if (reduction != 1 || !sharded_batch) return run_strategy(op, stack, &nll_loss_strategy);

  const DTensorSpec& spec = *self.spec;
  for (const auto& p : spec.placements) {
    if (p.is_partial() || (p.is_shard() && p.dim() != 0)) return run_strategy(op, stack, &nll_loss_strategy);
  }
  const TensorInput* target = call.tensor_arg(1);
  if (!target) return run_strategy(op, stack, &nll_loss_strategy);
  const TensorInput* weight = call.tensor_arg(2);
  at::Tensor w_local;
  if (weight) w_local = weight->spec ? full_tensor(weight->tensor) : weight->tensor;
  at::Tensor local_self = detail::local_tensor(self.tensor);
  // The target follows the batch: a DTensor target is redistributed like self, a plain one (replicated, as
  // loss_parallel's plain labels) is cut locally.
  const DTensorSpec target_spec =
      target->spec ? *target->spec
                   : DTensorSpec(spec.mesh, replicate_all(spec.mesh.ndim()),
                                 TensorMeta{target->tensor.sizes().vec(), {}, target->tensor.scalar_type()});
  const at::Tensor& target_local = target->spec ? detail::local_tensor(target->tensor) : target->tensor;
  at::Tensor local_target = redistribute_local(target_local, target_spec, spec.placements);
  at::AutoDispatchBelowADInplaceOrView guard;
  auto [local_sum, local_total] = at::nll_loss_forward(local_self, local_target, w_local, /*sum*/ 2, call.arg(4).toInt());
  at::Tensor total = local_total;
  for (int64_t i = 0; i < spec.mesh.ndim(); ++i) {
    if (spec.placements[i].is_shard()) total = all_reduce(total, ReduceOp::SUM, spec.mesh.get_group(i));
  }
  at::Tensor out = local_sum / total;
  Placements out_p = spec.placements, total_p = replicate_all(spec.mesh.ndim());
  for (auto& p : out_p) {
    if (p.is_shard()) p = Partial();
  }
  torch::jit::drop(*stack, call.num_args());
  stack->emplace_back(detail::make_dtensor(out, DTensorSpec(spec.mesh, out_p, TensorMeta{{}, {}, out.scalar_type()})));
  stack->emplace_back(detail::make_dtensor(total, DTensorSpec(spec.mesh, total_p, TensorMeta{{}, {}, total.scalar_type()})));
}

// nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight)
ShardingDecision nll_loss_backward(const OpCall& call) {
  const TensorInput& self = *call.tensor_arg(1);
  Placements p = reduce_partials(self.spec ? self.spec->placements : replicate_all(call.mesh->ndim()));
  for (auto& x : p) {
    if (x.is_shard() && (x.dim() != 0 || self.tensor.dim() != 2)) x = Replicate();
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    if (t.arg == 1) inputs.push_back(p);
    else if (t.arg == 2) inputs.push_back(placements_or_null(t, p));
    else inputs.push_back(placements_or_null(t, replicate_all(call.mesh->ndim())));
  }
  // 'none' has a per-sample grad_output: it follows the batch.
  if (call.arg(4).toInt() == 0) {
    for (size_t k = 0; k < call.tensors.size(); ++k) {
      if (call.tensors[k].arg == 0) inputs[k] = placements_or_null(call.tensors[k], p);
    }
  }
  return make_decision(call, inputs, {p});
}

// --- embedding ---------------------------------------------------------------------------------------

// embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse)
ShardingDecision embedding_strategy(const OpCall& call) {
  const TensorInput& weight = call.tensors.at(0);
  const TensorInput& ids = call.tensors.at(1);
  const int64_t out_last = ids.tensor.dim();  // output is ids.shape + [D]
  ShardingDecision d = choose_per_mesh_dim(call, 1, [&](int64_t) {
    std::vector<DimCandidate> c;
    c.push_back({{Shard(1), Replicate()}, {Shard(out_last)}});
    for (int64_t k = 0; k < ids.tensor.dim(); ++k) c.push_back({{Replicate(), Shard(k)}, {Shard(k)}});
    c.push_back({{Replicate(), Replicate()}, {Replicate()}});
    return c;
  });
  std::vector<int64_t> shape = ids.tensor.sizes().vec();
  shape.push_back(weight.tensor.size(1));
  d.output_shapes = {shape};
  return d;
}

// The vocab-sharded case (weight Shard(0) on one or more mesh dims, ids replicated there): each rank looks
// up the rows it owns and yields zeros for the others, a Partial(sum) of the full lookup.
bool vocab_sharded(const TensorInput& weight) {
  if (!weight.spec) return false;
  for (const auto& p : weight.spec->placements) {
    if (p.is_shard(0)) return true;
  }
  return false;
}

void embedding(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall call(op, stack);
  const TensorInput& weight = call.tensors.at(0);
  if (!vocab_sharded(weight)) return run_strategy(op, stack, &embedding_strategy);
  const DTensorSpec& wspec = *weight.spec;
  const TensorInput& ids = call.tensors.at(1);
  // ids replicated where the vocab is sharded; other mesh dims: as the ids are.
  Placements ids_target = ids.spec ? reduce_partials(ids.spec->placements) : replicate_all(wspec.mesh.ndim());
  Placements out_p(wspec.mesh.ndim(), Replicate());
  Placements w_target = wspec.placements;
  for (int64_t i = 0; i < wspec.mesh.ndim(); ++i) {
    if (wspec.placements[i].is_shard(0)) {
      ids_target[i] = Replicate();
      out_p[i] = Partial();
    } else {
      w_target[i] = Replicate();
      if (ids_target[i].is_shard()) out_p[i] = ids_target[i];
    }
  }
  at::Tensor w_local = redistribute_local(detail::local_tensor(weight.tensor), wspec, w_target);
  at::Tensor id_local = ids.spec ? redistribute_local(detail::local_tensor(ids.tensor), *ids.spec, ids_target)
                                 : ids.tensor;
  // Each rank sees only its rows, so an id outside the vocabulary would silently look up zeros: check it
  // as the plain lookup does (the ids are whole on every rank here, so every rank raises the same error).
  const int64_t vocab = wspec.meta.shape[0];
  if (id_local.numel() > 0 && !id_local.is_cpu()) {
    // On a device, without a host synchronisation: the check fails the stream (as the plain CUDA lookup does).
    if (!id_local.is_meta()) {
      at::_assert_async(id_local.ge(0).logical_and(id_local.lt(vocab)).all(),
                        "dtensor: embedding: a token id is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  } else if (id_local.numel() > 0) {
    const int64_t lo = id_local.min().item<int64_t>(), hi = id_local.max().item<int64_t>();
    if (lo < 0 || hi >= vocab) {
      call.fail("index out of range in self: token id " + std::to_string(lo < 0 ? lo : hi) +
                " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  LocalShard shard = local_shard(wspec.meta.shape, wspec.mesh, w_target, *wspec.mesh.get_coordinate());
  const int64_t start = shard.offset[0], rows = shard.shape[0];
  at::Tensor mask = (id_local < start).bitwise_or(id_local >= start + rows);  // (bitwise: a C++ meta kernel)  // ids this rank does not own
  at::Tensor shifted = (id_local - start).masked_fill(mask, 0);
  at::Tensor out;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    if (rows > 0) {
      out = at::embedding(w_local, shifted).masked_fill_(mask.unsqueeze(-1), 0);
    } else {
      std::vector<int64_t> local_shape = shifted.sizes().vec();
      local_shape.push_back(w_local.size(1));
      out = at::zeros(local_shape, w_local.options());
    }
  }
  std::vector<int64_t> shape = ids.tensor.sizes().vec();
  shape.push_back(wspec.meta.shape[1]);
  torch::jit::drop(*stack, call.num_args());
  stack->emplace_back(detail::make_dtensor(out, DTensorSpec(wspec.mesh, out_p, TensorMeta{shape, {}, out.scalar_type()})));
}

// embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq)
ShardingDecision embedding_backward(const OpCall& call) {
  const TensorInput& grad = call.tensors.at(0);
  const TensorInput& ids = call.tensors.at(1);
  const int64_t grad_last = grad.tensor.dim() - 1;
  ShardingDecision d = choose_per_mesh_dim(call, 1, [&](int64_t) {
    // Replicate first: a replicated grad (a vocab-sharded embedding's) gives a Replicate weight grad, as
    // PyTorch's does, rather than a free slice to Shard(1), whose placement differs from the weight's.
    std::vector<DimCandidate> c;
    c.push_back({{Replicate(), Replicate()}, {Replicate()}});
    c.push_back({{Shard(grad_last), Replicate()}, {Shard(1)}});
    for (int64_t k = 0; k < ids.tensor.dim(); ++k) c.push_back({{Shard(k), Shard(k)}, {Partial()}});
    return c;
  });
  d.output_shapes = {{call.arg(2).toInt(), grad.tensor.size(grad_last)}};  // [num_weights, D]
  return d;
}

const StrategyRegistration layer_norm_rule({"aten::native_layer_norm"}, &layer_norm);
const StrategyRegistration layer_norm_backward_rule({"aten::native_layer_norm_backward"}, &layer_norm_backward);
const StrategyRegistration sdpa_rule({"aten::_scaled_dot_product_flash_attention_for_cpu"}, &sdpa_forward);
const StrategyRegistration sdpa_backward_rule({"aten::_scaled_dot_product_flash_attention_for_cpu_backward"}, &sdpa_backward);
const StrategyRegistration efficient_attention_rule({"aten::_scaled_dot_product_efficient_attention"},
                                                    &efficient_attention);
const StrategyRegistration efficient_attention_backward_rule({"aten::_scaled_dot_product_efficient_attention_backward"},
                                                             &efficient_attention_backward);
void nll_loss_backward_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  OpCall call(op, stack);
  const TensorInput* self = call.tensor_arg(1);
  bool class_sharded = false;
  if (self && self->spec && self->tensor.dim() == 2) {
    for (const auto& p : self->spec->placements) class_sharded = class_sharded || p.is_shard(1);
  }
  if (LossParallelGuard::active() && class_sharded) return loss_parallel_nll_backward(call);
  run_strategy(op, stack, &nll_loss_backward);
}
const CustomHandlerRegistration nll_loss_backward_rule("aten::nll_loss_backward", &nll_loss_backward_handler);
const StrategyRegistration embedding_backward_rule({"aten::embedding_dense_backward"}, &embedding_backward);
const CustomHandlerRegistration fused_sdp_choice_rule("aten::_fused_sdp_choice", &fused_sdp_choice);
const CustomHandlerRegistration nll_loss_forward_rule("aten::nll_loss_forward", &nll_loss_forward);
const CustomHandlerRegistration embedding_rule("aten::embedding", &embedding);

}  // namespace
}  // namespace dtensor::ops
