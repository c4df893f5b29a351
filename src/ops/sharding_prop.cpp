#include "ops/sharding_prop.h"
#include "dtensor/error.h"

#include <ATen/ATen.h>

#include <cstring>
#include <iostream>
#include <mutex>
#include <unordered_map>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/tensor/dtensor.h"
#include "tensor/dtensor_impl.h"

namespace dtensor {

namespace {
thread_local bool implicit_replication = false;
}

ImplicitReplicationGuard::ImplicitReplicationGuard() : previous_(implicit_replication) { implicit_replication = true; }
ImplicitReplicationGuard::~ImplicitReplicationGuard() { implicit_replication = previous_; }
bool ImplicitReplicationGuard::active() { return implicit_replication; }

DispatchStats& dispatch_stats() {
  thread_local DispatchStats stats;
  return stats;
}

namespace ops {

// ------------------------------------------------------------------------------------------------- OpCall

namespace {
// Autograd's backward of split / chunk / unbind fills the gradients of unused outputs with plain zeros of
// the global shape and concatenates (cat / stack) them with the DTensor gradients; max.dim's backward
// scatters the gradient into plain zeros. A plain all-zero tensor
// there is a replicated zero, whatever the op's other inputs are; nothing else plain is accepted.
bool autograd_zeros(const c10::OperatorHandle& op, const at::Tensor& t) {
  const auto& name = op.operator_name().name;
  if (name != "aten::cat" && name != "aten::stack" && name.rfind("aten::scatter", 0) != 0) return false;
  at::AutoDispatchBelowADInplaceOrView guard;
  return t.count_nonzero().item<int64_t>() == 0;
}
}  // namespace

OpCall::OpCall(const c10::OperatorHandle& op_, torch::jit::Stack* stack_)
    : op(op_), stack(stack_), first_(stack_->size() - op_.schema().arguments().size()) {
  const size_t n = num_args();
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[first_ + i];
    auto add = [&](const at::Tensor& t, int list_index) {
      if (!t.defined()) return;
      const DTensorSpec* spec = detail::get_impl(t) ? &detail::get_impl(t)->spec() : nullptr;
      if (spec && !mesh) mesh = &spec->mesh;
      tensors.push_back(TensorInput{static_cast<int>(i), list_index, t, spec});
    };
    if (v.isTensor()) {
      add(v.toTensor(), -1);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) add(list.get(k), static_cast<int>(k));
    } else if (v.isList()) {
      // Tensor?[] (index ops)
      auto list = v.toListRef();
      for (size_t k = 0; k < list.size(); ++k) {
        if (list[k].isTensor()) add(list[k].toTensor(), static_cast<int>(k));
      }
    }
  }
  for (const auto& t : tensors) {
    if (t.spec && t.spec->mesh != *mesh) fail("got DTensors on different meshes");
    if (!t.spec && t.tensor.dim() != 0 && !ImplicitReplicationGuard::active() && !autograd_zeros(op, t.tensor)) {
      fail("got mixed plain at::Tensor and DTensor arguments; convert the plain tensor with distribute_tensor or "
           "DTensor::from_local first (or allow it with dtensor::ImplicitReplicationGuard)");
    }
  }
}

std::string OpCall::describe() const { return describe_inputs(op, *stack); }
void OpCall::fail(const std::string& why) const { ops::fail(op, *stack, why); }

const TensorInput* OpCall::tensor_arg(size_t i) const {
  for (const auto& t : tensors) {
    if (t.arg == static_cast<int>(i) && t.list_index < 0) return &t;
  }
  return nullptr;
}

int64_t OpCall::ndim_of(size_t i) const {
  const TensorInput* t = tensor_arg(i);
  return t ? t->tensor.dim() : 0;
}

// ------------------------------------------------------------------------------------------------- registry

namespace {

std::mutex& strategy_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<std::string, StrategyFn>& strategies() {
  static std::unordered_map<std::string, StrategyFn> s;
  return s;
}

void strategy_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // The strategy was looked up once per op by the boxed kernel's cache of handlers; here we find it by name
  // (once per op per thread).
  thread_local std::unordered_map<const void*, StrategyFn> cache;
  auto it = cache.find(&op.schema());
  if (it == cache.end()) {
    std::lock_guard<std::mutex> lock(strategy_mutex());
    it = cache.emplace(&op.schema(), strategies().at(op_name(op))).first;
  }
  run_strategy(op, stack, it->second);
}

}  // namespace

void register_strategy(const std::vector<std::string>& qualified_names, StrategyFn strategy) {
  for (const auto& name : qualified_names) {
    {
      std::lock_guard<std::mutex> lock(strategy_mutex());
      strategies()[name] = strategy;
    }
    register_op(name, &strategy_handler);
  }
}

bool has_strategy(const std::string& qualified_name) {
  std::lock_guard<std::mutex> lock(strategy_mutex());
  return strategies().count(qualified_name) > 0;
}


// ------------------------------------------------------------------------------------------------- helpers

Placements replicate_all(int64_t mesh_ndim) { return Placements(mesh_ndim, Replicate()); }

Placements reduce_partials(Placements p) {
  for (auto& x : p) {
    if (x.is_partial()) x = Replicate();
  }
  return p;
}

// ------------------------------------------------------------------------------------------------- cache

namespace {

struct OutputMeta {
  std::vector<int64_t> shape, stride;
  c10::ScalarType dtype;
};

struct Entry {
  ShardingDecision decision;
  std::vector<OutputMeta> outputs;  // global shape of each output tensor
  std::vector<std::optional<DTensorSpec>> specs;  // the outputs' specs, built once (hot path: copied)
  bool from_locals = false;         // no meta kernel: outputs are learnt from the first local run
};

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& k) const {
    size_t h = 1469598103934665603ull;
    for (int64_t w : k) h = (h ^ static_cast<size_t>(w)) * 1099511628211ull;
    return h;
  }
};

void put_tensor(std::vector<int64_t>& key, const at::Tensor& t) {
  if (!t.defined()) {
    key.push_back(-7);
    return;
  }
  auto* impl = detail::get_impl(t);
  key.push_back(impl ? 1 : 2);
  key.push_back(static_cast<int64_t>(t.scalar_type()));
  key.push_back(t.dim());
  for (int64_t s : t.sizes()) key.push_back(s);
  if (impl) {
    const DTensorSpec& spec = impl->spec();
    key.push_back(reinterpret_cast<intptr_t>(spec.mesh.id()));
    for (const auto& p : spec.placements) key.push_back(static_cast<int64_t>(p.hash()));
    for (int64_t s : spec.meta.stride) key.push_back(s);
  }
}

// The cache key: op, tensors' specs, non-tensor args. Returns false for args it cannot key (no caching).
bool build_key(const OpCall& call, std::vector<int64_t>& key) {
  key.push_back(reinterpret_cast<intptr_t>(&call.op.schema()));
  for (size_t i = 0; i < call.num_args(); ++i) {
    const c10::IValue& v = call.arg(i);
    if (v.isTensor()) {
      put_tensor(key, v.toTensor());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      key.push_back(-1000 - static_cast<int64_t>(list.size()));
      for (size_t k = 0; k < list.size(); ++k) put_tensor(key, list.get(k));
    } else if (v.isNone()) {
      key.push_back(-3);
    } else if (v.isInt()) {
      key.push_back(-4);
      key.push_back(v.toInt());
    } else if (v.isBool()) {
      key.push_back(v.toBool() ? -5 : -6);
    } else if (v.isDouble()) {
      double d = v.toDouble();
      int64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      key.push_back(-8);
      key.push_back(bits);
    } else if (v.isIntList()) {
      auto list = v.toIntList();
      key.push_back(-2000 - static_cast<int64_t>(list.size()));
      for (int64_t x : list) key.push_back(x);
    } else if (v.isScalar()) {
      // Scalars that are not Int/Double/Bool (complex, symbolic): not keyed.
      return false;
    } else if (v.isDevice()) {
      key.push_back(-9);
      key.push_back(static_cast<int64_t>(v.toDevice().type()));
    } else if (v.isString()) {
      key.push_back(-10);
      key.push_back(static_cast<int64_t>(std::hash<std::string>()(v.toStringRef())));
    } else {
      return false;
    }
  }
  return true;
}

at::Tensor meta_of(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
}

// Global shapes of the outputs: run the op on meta tensors of the inputs' global shapes.
std::vector<OutputMeta> meta_outputs(const OpCall& call) {
  torch::jit::Stack meta_stack;
  for (size_t i = 0; i < call.num_args(); ++i) {
    const c10::IValue& v = call.arg(i);
    if (v.isTensor()) {
      meta_stack.emplace_back(meta_of(v.toTensor()));
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> metas;
      for (size_t k = 0; k < list.size(); ++k) metas.push_back(meta_of(list.get(k)));
      meta_stack.emplace_back(metas);
    } else {
      meta_stack.push_back(v);
    }
  }
  call.op.callBoxed(&meta_stack);
  std::vector<OutputMeta> out;
  for (const auto& v : meta_stack) {
    auto add = [&](const at::Tensor& t) {
      // Undefined outputs (a backward's unneeded gradient) keep their slot.
      out.push_back(t.defined() ? OutputMeta{t.sizes().vec(), t.strides().vec(), t.scalar_type()}
                                : OutputMeta{{}, {}, at::ScalarType::Undefined});
    };
    if (v.isTensor()) add(v.toTensor());
    else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) add(list.get(k));
    }
  }
  return out;
}

// Index (within the op's inputs) of the argument an in-place or out= return aliases, or -1.
int written_input_for_return(const c10::FunctionSchema& schema, size_t ret) {
  const auto& r = schema.returns()[ret];
  if (!r.alias_info() || !r.alias_info()->isWrite()) return -1;
  for (size_t i = 0; i < schema.arguments().size(); ++i) {
    const auto& a = schema.arguments()[i];
    if (a.alias_info() && a.alias_info()->isWrite() && a.alias_info()->beforeSets() == r.alias_info()->beforeSets()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// For ops without a meta kernel: the global shape of each output from its local shape and placements,
// summing the sizes of sharded dims over each sharding mesh dim's group (innermost first). Every rank takes
// this path for the same key, so the exchanges match up. Strides are taken contiguous.
std::vector<OutputMeta> global_outputs_from_locals(const DeviceMesh& mesh, const std::vector<Placements>& placements,
                                                   const torch::jit::Stack& stack, size_t num_returns) {
  std::vector<at::Tensor> locals;
  for (size_t r = 0; r < num_returns; ++r) {
    const c10::IValue& v = stack[stack.size() - num_returns + r];
    if (v.isTensor()) locals.push_back(v.toTensor());
    else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) locals.push_back(list.get(k));
    }
  }
  std::vector<OutputMeta> out;
  for (size_t o = 0; o < locals.size(); ++o) {
    if (!locals[o].defined()) {
      out.push_back({{}, {}, at::ScalarType::Undefined});
      continue;
    }
    std::vector<int64_t> shape = locals[o].sizes().vec();
    for (int64_t i = mesh.ndim() - 1; i >= 0; --i) {
      const Placement& p = placements.at(o)[i];
      if (!p.is_shard()) continue;
      auto sizes = exchange_sizes(shape[p.dim()], mesh.get_group(i));
      int64_t total = 0;
      for (int64_t s : sizes) total += s;
      shape[p.dim()] = total;
    }
    out.push_back({shape, contiguous_strides(shape), locals[o].scalar_type()});
  }
  return out;
}

}  // namespace

void run_strategy(const c10::OperatorHandle& op, torch::jit::Stack* stack, StrategyFn strategy) {
  OpCall call(op, stack);
  if (!call.mesh) fail(op, *stack, "reached the DTensor kernel without a DTensor input");

  thread_local std::unordered_map<std::vector<int64_t>, Entry, KeyHash> cache;
  thread_local std::vector<int64_t> key;
  key.clear();
  const bool cacheable = build_key(call, key);
  const Entry* entry = nullptr;
  Entry fresh;
  if (cacheable) {
    auto it = cache.find(key);
    if (it != cache.end()) {
      entry = &it->second;
      ++dispatch_stats().cache_hits;
    }
  }
  if (!entry) {
    ++dispatch_stats().cache_misses;
    fresh.decision = strategy(call);
    if (fresh.decision.inputs.size() != call.tensors.size()) {
      throw dtensor::Error("dtensor: strategy for " + op_name(op) + " returned the wrong number of inputs");
    }
    if (!fresh.decision.output_shapes.empty()) {
      for (const auto& shape : fresh.decision.output_shapes) {
        fresh.outputs.push_back({shape, contiguous_strides(shape), call.tensors.at(0).tensor.scalar_type()});
      }
    } else try {
      fresh.outputs = meta_outputs(call);
    } catch (const c10::Error& e) {
      if (std::getenv("DTENSOR_DEBUG_META")) std::cerr << "meta failed for " << op_name(op) << ": " << e.what_without_backtrace() << std::endl;
      fresh.from_locals = true;  // an op without a meta kernel: see global_outputs_from_locals
    }
    if (!fresh.from_locals && fresh.outputs.size() != fresh.decision.outputs.size()) {
      throw dtensor::Error("dtensor: strategy for " + op_name(op) + " returned " +
                             std::to_string(fresh.decision.outputs.size()) + " output placements for " +
                             std::to_string(fresh.outputs.size()) + " outputs");
    }
    entry = cacheable ? &cache.emplace(key, std::move(fresh)).first->second : &fresh;
  }
  Entry* mutable_entry = const_cast<Entry*>(entry);
  const ShardingDecision& decision = entry->decision;

  // Redistribute the inputs and put the locals on the stack. In-place and out= inputs must not move.
  const auto& schema = op.schema();
  // Only ops that write an argument need the original wrappers back.
  thread_local std::vector<c10::IValue> originals;
  originals.clear();
  if (schema.is_mutable()) {
    for (size_t i = 0; i < call.num_args(); ++i) originals.push_back(call.arg(i));
  }
  std::vector<at::Tensor> locals(call.tensors.size());
  for (size_t k = 0; k < call.tensors.size(); ++k) {
    const TensorInput& in = call.tensors[k];
    if (!in.spec) {
      // A plain tensor is replicated (a 0-d scalar, or under ImplicitReplicationGuard): cutting it is local.
      const auto& target = decision.inputs[k];
      locals[k] = in.tensor;
      if (target && !in.is_scalar() && *target != replicate_all(call.mesh->ndim())) {
        DTensorSpec replicated(*call.mesh, replicate_all(call.mesh->ndim()),
                               TensorMeta{in.tensor.sizes().vec(), {}, in.tensor.scalar_type()});
        locals[k] = redistribute_local(in.tensor, replicated, *target);
      }
      continue;
    }
    const at::Tensor& local = detail::get_impl(in.tensor)->local();
    const auto& target = decision.inputs[k];
    if (target && *target != in.spec->placements) {
      const auto& a = schema.arguments()[in.arg];
      if (a.alias_info() && a.alias_info()->isWrite()) {
        call.fail("would have to change the placements of its in-place / out= argument '" + a.name() + "' from " +
                  to_string(in.spec->placements) + " to " + to_string(*target));
      }
      locals[k] = redistribute_local(local, *in.spec, *target);
    } else {
      locals[k] = local;
    }
  }
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
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.callBoxed(stack);
  }

  const size_t num_returns = schema.returns().size();
  if (entry->from_locals && entry->outputs.empty()) {
    mutable_entry->outputs = global_outputs_from_locals(*call.mesh, decision.outputs, *stack, num_returns);
  }

  // Wrap the outputs.
  size_t out_index = 0;
  for (size_t r = 0; r < num_returns; ++r) {
    c10::IValue& v = (*stack)[stack->size() - num_returns + r];
    auto wrap = [&](const at::Tensor& local_out) -> at::Tensor {
      const size_t o = out_index++;
      if (!local_out.defined()) return local_out;
      if (mutable_entry->specs.size() <= o) mutable_entry->specs.resize(o + 1);
      auto& cached = mutable_entry->specs[o];
      if (!cached) {
        const OutputMeta& m = entry->outputs[o];
        cached.emplace(*call.mesh, decision.outputs[o], TensorMeta{m.shape, m.stride, m.dtype});
      }
      return detail::make_dtensor(local_out, *cached);
    };
    int written = written_input_for_return(schema, r);
    if (written >= 0 && !originals.empty() && originals[written].isTensor() &&
        is_dtensor(originals[written].toTensor())) {
      // In place / out=: the caller's wrapper is the result; its shard was written (or replaced) locally.
      const at::Tensor& wrapper = originals[written].toTensor();
      auto* impl = detail::get_impl(wrapper);
      const OutputMeta& m = entry->outputs[out_index];
      const Placements& p = decision.outputs[out_index];
      ++out_index;
      at::Tensor local_out = v.toTensor();
      if (!local_out.is_same(impl->local()) || impl->spec().placements != p) {
        impl->replace(local_out, DTensorSpec(impl->spec().mesh, p, TensorMeta{m.shape, m.stride, m.dtype}));
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

}  // namespace ops

void register_sharding(const std::string& qualified_name, ops::StrategyFn strategy) {
  ops::register_strategy({qualified_name}, strategy);
}

}  // namespace dtensor
