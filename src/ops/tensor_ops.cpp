// Ops autograd and parameter bookkeeping need on DTensors (PyTorch's _tensor_ops.py family):
// aliases, factory-likes (grad seeds), clone / dtype casts, in-place fills and copies.
//
// Placement rules used here:
//   alias / detach / clone / _to_copy     output spec = input spec (dtype follows the op)
//   *_like factories                      Partial -> Replicate (new values are not terms of a sum),
//                                         Shard / Replicate kept
//   new_* factories                       Shard(d) kept where dim d keeps its size, else Replicate
//   zero_                                 placements kept (0 is a valid term of every reduction)
//   fill_(v)                              placements kept; on Partial(sum) dims one rank holds v, the
//                                         others 0 (Replicate -> Partial of the filled value)
//   copy_(src)                            src is redistributed to self's placements first
//
// Strategies: alias/detach/clone, *_like, new_empty_strided, zero_. Custom handlers (the local computation is
// not the op on the shards): _to_copy (refuses a device move), fill_ and copy_ from a plain value (Partial terms
// differ per rank), new_* (the size argument is global), item() (the value of a sharded tensor needs a gather).
#include "dtensor/core/error.h"
#include <ATen/ATen.h>

#include <stdexcept>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/tensor/shard_layout.h"
#include "dtensor/api/dtensor_api.h"
#include "ops/op_call.h"
#include "ops/op_table.h"
#include "tensor/dtensor_impl.h"

namespace dtensor::ops {
namespace {

using torch::jit::Stack;

c10::IValue& input(const c10::OperatorHandle& op, Stack* stack, size_t i) {
  return (*stack)[stack->size() - op.schema().arguments().size() + i];
}

DTensorSpec spec_with(const DTensorSpec& spec, Placements placements, c10::ScalarType dtype) {
  return DTensorSpec(spec.mesh, std::move(placements), TensorMeta{spec.meta.shape, spec.meta.stride, dtype});
}

void to_copy(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor& self = input(op, stack, 0).toTensor();
  // The local's device: a dry run's DTensor has meta locals on a cpu mesh, and a cast keeps them meta. A device
  // argument naming the DTensor's own device (autograd's ToCopyBackward passes the input's options) is the local's.
  const c10::Device device = detail::local_tensor(self).device();
  c10::IValue& device_arg = input(op, stack, 3);  // _to_copy(self, *, dtype, layout, device, pin_memory, ...)
  if (device_arg.isDevice() && device_arg.toDevice() == self.device()) device_arg = c10::IValue(device);
  DTensorSpec spec = dtensor_spec(self);
  call_local(op, stack);
  at::Tensor out = stack->back().toTensor();
  DTENSOR_CHECK(out.device() == device, "dtensor: moving a DTensor to another device (", out.device().str(),
                ") is not supported; its mesh is on ", spec.mesh.device_type());
  stack->back() = detail::make_dtensor(out, spec_with(spec, spec.placements, out.scalar_type()));
}

// Holds `value` everywhere, then turns Partial mesh dims into their terms (Replicate -> Partial).
void partition_in_place(at::Tensor& local, const DTensorSpec& spec) {
  auto coord = *spec.mesh.get_coordinate();
  for (int64_t i = 0; i < spec.mesh.ndim(); ++i) {
    if (spec.placements[i].is_partial()) {
      local.copy_(partition_value(local, spec.placements[i].reduce_op(), coord[i], spec.mesh.size(i)));
    }
  }
}

void fill_(const c10::OperatorHandle& op, Stack* stack) {
  c10::IValue self = input(op, stack, 0);
  c10::IValue& value = input(op, stack, 1);
  if (value.isTensor()) {
    const at::Tensor& v = value.toTensor();
    if (is_dtensor(v) && !dtensor_spec(v).is_replicated()) fail(op, *stack, "needs a replicated fill value");
    value = (is_dtensor(v) ? detail::local_tensor(v) : v).item();
  }
  std::vector<at::Tensor> locals{detail::local_tensor(self.toTensor())};
  call_local(op, stack, &locals);
  at::Tensor local = detail::local_tensor(self.toTensor());
  partition_in_place(local, dtensor_spec(self.toTensor()));
  stack->back() = self;
}

// A plain 0-d tensor next to a DTensor is a replicated scalar; any other plain tensor is an error.
void require_scalar_if_plain(const c10::OperatorHandle& op, const Stack& stack, const at::Tensor& t) {
  if (!is_dtensor(t) && t.dim() != 0) {
    fail(op, stack, "got mixed plain at::Tensor and DTensor arguments; convert the plain tensor with "
                    "distribute_tensor or DTensor::from_local first (a stock torch::nn model parallelized by a plan is "
                    "called with plain tensors through dtensor::Parallelized, dtensor/tp/parallelized.h)");
  }
}

void check_same_mesh_and_shape(const c10::OperatorHandle& op, const Stack& stack, const at::Tensor& a,
                               const at::Tensor& b) {
  if (dtensor_spec(a).mesh != dtensor_spec(b).mesh) fail(op, stack, "got DTensors on different meshes");
  if (a.sizes() != b.sizes()) {
    fail(op, stack, "with broadcasting between DTensors of different shapes is not supported yet");
  }
}

void copy_(const c10::OperatorHandle& op, Stack* stack) {
  c10::IValue self = input(op, stack, 0);
  const at::Tensor& dst = self.toTensor();
  const at::Tensor& src = input(op, stack, 1).toTensor();
  if (!is_dtensor(dst)) fail(op, *stack, "into a plain tensor from a DTensor is not supported; use full_tensor()");
  const DTensorSpec& dst_spec = dtensor_spec(dst);
  std::vector<at::Tensor> locals{detail::local_tensor(dst)};
  if (is_dtensor(src)) {
    check_same_mesh_and_shape(op, *stack, dst, src);
    // Bring the source to the destination's layout, then copy shard to shard.
    locals.push_back(redistribute_local(detail::local_tensor(src), dtensor_spec(src), dst_spec.placements));
    call_local(op, stack, &locals);
  } else {
    require_scalar_if_plain(op, *stack, src);
    call_local(op, stack, &locals);
    partition_in_place(locals[0], dst_spec);
  }
  stack->back() = self;
}

// new_zeros / new_ones / new_empty / new_full(self, size, ...): a tensor of the given global size whose
// value is the same at every index, so any layout of it is correct. A Shard(d) of self is kept where the
// new tensor's dim d has self's size (each rank allocates its part along d, as self is split: a KV cache
// new_zeros({b, heads, max_len, d}) from keys sharded by heads is sharded by heads); other mesh dims, and
// Partial, give Replicate. PyTorch keeps self's spec only when the whole shape is equal, else Replicate: the
// same result wherever both apply. A custom handler because the size argument is global and the local
// call takes this rank's shard of it.
void new_factory(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor self = input(op, stack, 0).toTensor();
  const DTensorSpec& spec = dtensor_spec(self);
  const std::vector<int64_t> size = input(op, stack, 1).toIntVector();
  Placements out = replicate_all(spec.mesh.ndim());
  for (size_t i = 0; i < out.size(); ++i) {
    const Placement& p = spec.placements[i];
    if (p.is_shard() && p.dim() < static_cast<int64_t>(size.size()) && size[p.dim()] == self.size(p.dim())) out[i] = p;
  }
  DTensorSpec out_spec(spec.mesh, out, TensorMeta{size, contiguous_strides(size), self.scalar_type()});
  input(op, stack, 1) = c10::IValue(local_shard(out_spec).shape);
  call_local(op, stack);
  at::Tensor local = stack->back().toTensor();
  out_spec.meta.dtype = local.scalar_type();
  stack->back() = detail::make_dtensor(local, out_spec);
}

// item(): the value is the same everywhere once the tensor is replicated.
void local_scalar_dense(const c10::OperatorHandle& op, Stack* stack) {
  at::Tensor self = input(op, stack, 0).toTensor();
  at::Tensor value = dtensor_spec(self).is_replicated() ? detail::local_tensor(self) : full_tensor(self).detach();
  torch::jit::drop(*stack, 1);
  at::AutoDispatchBelowADInplaceOrView guard;
  stack->emplace_back(value.item());
}

// equal(self, other) -> bool (torch::nn::MultiheadAttention asks it to detect self-attention). Equal global
// shapes and equal non-Partial placements: the local answers, AND-ed over the mesh (a MIN all-reduce on each
// mesh dim that shards; replicated dims agree already). Anything else (a Partial, different placements, a
// plain tensor under implicit replication) compares the full tensors.
void equal(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor a = input(op, stack, 0).toTensor();
  const at::Tensor b = input(op, stack, 1).toTensor();
  bool result = false;
  if (a.sizes() == b.sizes()) {
    const bool both = is_dtensor(a) && is_dtensor(b);
    const DTensorSpec* sa = is_dtensor(a) ? &dtensor_spec(a) : nullptr;
    const DTensorSpec* sb = is_dtensor(b) ? &dtensor_spec(b) : nullptr;
    at::AutoDispatchBelowADInplaceOrView guard;
    if (both && sa->mesh == sb->mesh && sa->placements == sb->placements && !sa->has_partial()) {
      at::Tensor local = at::scalar_tensor(at::equal(detail::local_tensor(a), detail::local_tensor(b)) ? 1 : 0,
                                           at::TensorOptions().dtype(at::kInt).device(detail::local_tensor(a).device()));
      for (size_t i = 0; i < sa->placements.size(); ++i) {
        if (sa->placements[i].is_shard()) local = all_reduce(local.reshape({1}), ReduceOp::MIN, sa->mesh, i).reshape({});
      }
      result = local.item<int>() == 1;
    } else {
      auto whole = [](const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t).detach() : t; };
      result = at::equal(whole(a), whole(b));
    }
  }
  torch::jit::drop(*stack, 2);
  stack->emplace_back(result);
}

// --- strategies: the same op on the local shards -------------------------------------------------------

// detach / alias / clone: the output is laid out as the input.
ShardingDecision same_as_input(const OpCall& call) {
  return ShardingDecision{{std::nullopt}, {call.tensors.at(0).spec->placements}, {}, {}};
}

// *_like factories: new values are not terms of a sum, so Partial -> Replicate; Shard / Replicate kept.
ShardingDecision like_factory(const OpCall& call) {
  return ShardingDecision{{std::nullopt}, {reduce_partials(call.tensors.at(0).spec->placements)}, {}, {}};
}

// new_empty_strided(self, size, stride, ...): a replicated tensor of the given global size.
ShardingDecision new_strided_factory(const OpCall& call) {
  return ShardingDecision{{std::nullopt}, {replicate_all(call.mesh->ndim())}, {}, {}};
}

// zero_: 0 is a valid term of every reduction, so the placements stay.
ShardingDecision zero_in_place(const OpCall& call) { return same_as_input(call); }

const StrategyRegistration alias_rules({"aten::detach", "aten::alias", "aten::clone"}, &same_as_input);
const StrategyRegistration like_factory_rules({"aten::ones_like", "aten::zeros_like", "aten::empty_like", "aten::full_like"},
                                              &like_factory);
const StrategyRegistration new_strided_factory_rule({"aten::new_empty_strided"}, &new_strided_factory);
const StrategyRegistration zero_rule({"aten::zero_"}, &zero_in_place);

// --- custom handlers: the local computation differs from the op on the shards ------------------------------
const CustomHandlerRegistration tensor_op_handlers[] = {
    {"aten::_local_scalar_dense", &local_scalar_dense},
    {"aten::equal", &equal},
    {"aten::_to_copy", &to_copy},
    {"aten::fill_.Scalar", &fill_},
    {"aten::fill_.Tensor", &fill_},
    {"aten::copy_", &copy_},
    {"aten::new_zeros", &new_factory},
    {"aten::new_ones", &new_factory},
    {"aten::new_empty", &new_factory},
    {"aten::new_full", &new_factory},
};

}  // namespace
}  // namespace dtensor::ops
