#include "ops/run_strategy.h"

#include <algorithm>
#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>

#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/api/dtensor_api.h"
#include "ops/decision_cache.h"
#include "ops/op_call.h"
#include "ops/output_meta.h"
#include "tensor/dtensor_impl.h"

namespace dtensor::ops {
namespace {

// 1. decide --------------------------------------------------------------------------------------------

CachedDecision decide_afresh(const OpCall& call, StrategyFn strategy) {
  CachedDecision fresh;
  fresh.decision = strategy(call);
  const std::string name = op_name(call.op);
  DTENSOR_CHECK(fresh.decision.inputs.size() == call.tensors.size(), "dtensor: strategy for ", name, " returned ",
                fresh.decision.inputs.size(), " input placements for ", call.tensors.size(), " tensor inputs");
  if (!fresh.decision.output_shapes.empty()) {
    for (const auto& shape : fresh.decision.output_shapes) {
      fresh.outputs.push_back({shape, contiguous_strides(shape), call.tensors.at(0).tensor.scalar_type()});
    }
  } else {
    try {
      fresh.outputs = meta_outputs(call);
    } catch (const c10::Error& e) {
      if (std::getenv("DTENSOR_DEBUG_META")) std::cerr << "meta failed for " << name << ": " << e.what_without_backtrace() << std::endl;
      fresh.from_locals = true;  // an op without a meta kernel: see global_outputs_from_locals
    }
  }
  DTENSOR_CHECK(fresh.from_locals || fresh.outputs.size() == fresh.decision.outputs.size(),
                "dtensor: strategy for ", name, " returned ", fresh.decision.outputs.size(), " output placements for ",
                fresh.outputs.size(), " outputs");
  return fresh;
}

CachedDecision* decide(const OpCall& call, StrategyFn strategy, CachedDecision& uncached) {
  DecisionCache& cache = DecisionCache::local();
  const bool cacheable = cache.key(call);
  if (cacheable) {
    if (CachedDecision* hit = cache.find()) {
      ++dispatch_stats().cache_hits;
      return hit;
    }
  }
  ++dispatch_stats().cache_misses;
  CachedDecision fresh = decide_afresh(call, strategy);
  if (!cacheable) {
    uncached = std::move(fresh);
    return &uncached;
  }
  return cache.insert(std::move(fresh));
}

// 2. redistribute --------------------------------------------------------------------------------------

// This rank's local tensor of each OpCall tensor, in the placements the decision asks for.
std::vector<at::Tensor> redistribute_inputs(const OpCall& call, const ShardingDecision& decision) {
  const auto& schema = call.op.schema();
  std::vector<at::Tensor> locals(call.tensors.size());
  for (size_t k = 0; k < call.tensors.size(); ++k) {
    const TensorInput& in = call.tensors[k];
    const auto& target = decision.inputs[k];
    if (!in.spec) {
      // A plain tensor is replicated (a 0-d scalar, or under ImplicitReplicationGuard): cutting it is local.
      locals[k] = in.tensor;
      if (target && !in.is_scalar() && *target != replicate_all(call.mesh->ndim())) {
        DTensorSpec replicated(*call.mesh, replicate_all(call.mesh->ndim()),
                               TensorMeta{in.tensor.sizes().vec(), {}, in.tensor.scalar_type()});
        locals[k] = redistribute_local(in.tensor, replicated, *target);
      }
      continue;
    }
    const at::Tensor& local = detail::get_impl(in.tensor)->local();
    if (!target || *target == in.spec->placements) {
      locals[k] = local;
      continue;
    }
    const auto& a = schema.arguments()[in.arg];
    if (a.alias_info() && a.alias_info()->isWrite()) {
      call.fail("would have to change the placements of its in-place / out= argument '" + a.name() + "' from " +
                to_string(in.spec->placements) + " to " + to_string(*target));
    }
    // A Partial input's reduction is remembered on its DTensor (unless the op returns an alias of its input,
    // which could later be written through): autograd saves the DTensor as it came, and backward asks again.
    const bool may_cache = in.spec->has_partial() &&
                           std::none_of(schema.returns().begin(), schema.returns().end(),
                                        [](const c10::Argument& r) { return r.alias_info() != nullptr; });
    const detail::DTensorImpl* impl = detail::get_impl(in.tensor);
    if (const at::Tensor* cached = may_cache ? impl->cached_redistribution(*target) : nullptr) {
      locals[k] = *cached;
      continue;
    }
    locals[k] = redistribute_local(local, *in.spec, *target);
    if (may_cache) impl->cache_redistribution(*target, locals[k]);
  }
  return locals;
}

// 3. run -----------------------------------------------------------------------------------------------

// The local mm of a sharded bf16 decode step (x [M, K] times a weight's transposed shard): the fast kernel
// (core/fast_kernels.h) in place of PyTorch's, its result pushed as the op's. False: PyTorch's runs.
bool run_fast_local(OpCall& call, const std::vector<at::Tensor>& locals) {
  static const c10::OperatorHandle mm = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");
  if (!(call.op == mm) || locals.size() != 2 || locals[1].dim() != 2) return false;
  const std::optional<at::Tensor> y = bf16_linear(locals[0], locals[1].t());
  if (!y) return false;
  torch::jit::drop(*call.stack, call.num_args());
  torch::jit::push(*call.stack, *y);
  return true;
}

// Puts the locals (and the local values of global shape arguments) on the stack and runs the op on them.
void run_local(OpCall& call, const ShardingDecision& decision, const std::vector<at::Tensor>& locals) {
  if (decision.local_int_lists.empty() && run_fast_local(call, locals)) return;
  for (size_t k = 0; k < call.tensors.size(); ++k) {
    const TensorInput& in = call.tensors[k];
    c10::IValue& slot = call.arg(in.arg);
    if (in.list_index < 0) {
      slot = locals[k];
    } else if (slot.isTensorList()) {
      auto list = slot.toTensorList().copy();
      list.set(in.list_index, locals[k]);
      slot = list;
    } else {
      auto list = slot.toList().copy();
      list.set(in.list_index, locals[k]);
      slot = list;
    }
  }
  for (const auto& [arg, value] : decision.local_int_lists) call.arg(arg) = c10::IValue(value);
  at::AutoDispatchBelowADInplaceOrView guard;
  call.op.callBoxed(call.stack);
}

// 4. wrap ----------------------------------------------------------------------------------------------

void wrap_outputs(const OpCall& call, CachedDecision& entry, const std::vector<c10::IValue>& originals) {
  const auto& schema = call.op.schema();
  const ShardingDecision& decision = entry.decision;
  torch::jit::Stack& stack = *call.stack;
  const size_t num_returns = schema.returns().size();
  if (entry.from_locals && entry.outputs.empty()) {
    entry.outputs = global_outputs_from_locals(*call.mesh, decision.outputs, stack, num_returns);
  }
  size_t out_index = 0;
  auto spec_of = [&](size_t o) {
    const OutputMeta& m = entry.outputs[o];
    return DTensorSpec(*call.mesh, decision.outputs[o], TensorMeta{m.shape, m.stride, m.dtype});
  };
  auto wrap = [&](const at::Tensor& local_out) -> at::Tensor {
    const size_t o = out_index++;
    if (!local_out.defined()) return local_out;
    return detail::make_dtensor(local_out, spec_of(o));
  };
  for (size_t r = 0; r < num_returns; ++r) {
    c10::IValue& v = stack[stack.size() - num_returns + r];
    const int written = written_input_for_return(schema, r);
    if (written >= 0 && !originals.empty() && originals[written].isTensor() && is_dtensor(originals[written].toTensor())) {
      // In place / out=: the caller's wrapper is the result; its shard was written (or replaced) locally.
      const at::Tensor& wrapper = originals[written].toTensor();
      auto* impl = detail::get_impl(wrapper);
      const size_t o = out_index++;
      const at::Tensor& local_out = v.toTensor();
      if (!local_out.is_same(impl->local()) || impl->spec().placements != decision.outputs[o]) {
        impl->replace(local_out, spec_of(o));
      }
      v = wrapper;
    } else if (v.isTensor()) {
      v = wrap(v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> wrapped;
      for (size_t k = 0; k < list.size(); ++k) wrapped.push_back(wrap(list.get(k)));
      v = wrapped;
    }
  }
}

}  // namespace

void run_strategy(const c10::OperatorHandle& op, torch::jit::Stack* stack, StrategyFn strategy) {
  OpCall call(op, stack);
  if (!call.mesh) fail(op, *stack, "reached the DTensor kernel without a DTensor input");
  CachedDecision uncached;
  CachedDecision* entry = decide(call, strategy, uncached);
  std::vector<at::Tensor> locals = redistribute_inputs(call, entry->decision);
  // Ops that write an argument return the caller's wrapper: keep the originals before the stack changes.
  std::vector<c10::IValue> originals;
  if (op.schema().is_mutable()) {
    for (size_t i = 0; i < call.num_args(); ++i) originals.push_back(call.arg(i));
  }
  run_local(call, entry->decision, locals);
  wrap_outputs(call, *entry, originals);
}

}  // namespace dtensor::ops
