// Ops autograd and parameter bookkeeping need on DTensors (PyTorch's _tensor_ops.py family):
// aliases, factory-likes (grad seeds), clone / dtype casts, in-place fills and copies, and add for
// gradient accumulation.
//
// Placement rules used here:
//   alias / detach / clone / _to_copy     output spec = input spec (dtype follows the op)
//   *_like factories                      Partial -> Replicate (new values are not terms of a sum),
//                                         Shard / Replicate kept
//   zero_                                 placements kept (0 is a valid term of every reduction)
//   fill_(v)                              placements kept; on Partial(sum) dims one rank holds v, the
//                                         others 0 (Replicate -> Partial of the filled value)
//   copy_(src) / add(self, other)         other is redistributed to self's placements first; adding two
//                                         Partial(sum|avg) terms is a term of the sum; Partial(max|min)
//                                         is not linear and is reduced first
#include <ATen/ATen.h>

#include <stdexcept>

#include "dtensor/redistribute/redistribute.h"
#include "dtensor/tensor/dtensor.h"
#include "ops/dispatch.h"
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

// Runs the op on the local shard of the first DTensor input and wraps the single output with `placements`
// (the input's when empty).
void local_unary(const c10::OperatorHandle& op, Stack* stack, const Placements* placements = nullptr) {
  int idx = first_dtensor_input(op, *stack);
  DTensorSpec spec = dtensor_spec(input(op, stack, idx).toTensor());
  call_local(op, stack);
  at::Tensor out = stack->back().toTensor();
  stack->back() = detail::make_dtensor(out, spec_with(spec, placements ? *placements : spec.placements, out.scalar_type()));
}

void alias_like(const c10::OperatorHandle& op, Stack* stack) { local_unary(op, stack); }

void to_copy(const c10::OperatorHandle& op, Stack* stack) {
  const at::Tensor& self = input(op, stack, 0).toTensor();
  c10::Device device = self.device();
  DTensorSpec spec = dtensor_spec(self);
  call_local(op, stack);
  at::Tensor out = stack->back().toTensor();
  if (out.device() != device) {
    throw std::runtime_error("dtensor: moving a DTensor to another device (" + out.device().str() +
                             ") is not supported; its mesh is on " + spec.mesh.device_type());
  }
  stack->back() = detail::make_dtensor(out, spec_with(spec, spec.placements, out.scalar_type()));
}

void factory_like(const c10::OperatorHandle& op, Stack* stack) {
  Placements placements = dtensor_spec(input(op, stack, 0).toTensor()).placements;
  for (auto& p : placements) {
    if (p.is_partial()) p = Replicate();
  }
  local_unary(op, stack, &placements);
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

void zero_(const c10::OperatorHandle& op, Stack* stack) {
  c10::IValue self = input(op, stack, 0);
  call_local(op, stack);
  stack->back() = self;
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
                    "distribute_tensor or DTensor::from_local first");
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

// add(self, other, alpha) and add_: both operands on one set of placements where addition is local.
void add(const c10::OperatorHandle& op, Stack* stack, bool in_place) {
  c10::IValue self_v = input(op, stack, 0);
  const at::Tensor& self = self_v.toTensor();
  const at::Tensor& other = input(op, stack, 1).toTensor();
  require_scalar_if_plain(op, *stack, self);
  require_scalar_if_plain(op, *stack, other);
  const at::Tensor& donor = is_dtensor(self) ? self : other;
  const DTensorSpec& spec = dtensor_spec(donor);
  const bool both = is_dtensor(self) && is_dtensor(other);
  if (both) check_same_mesh_and_shape(op, *stack, self, other);
  // Target placements: self's, with the Partials the addition cannot keep reduced (max/min are not
  // linear; a replicated scalar added to each Partial(sum) term would count n times).
  Placements target = spec.placements;
  for (auto& p : target) {
    if (!p.is_partial()) continue;
    bool keeps = both ? (p.reduce_op() == ReduceOp::SUM || p.reduce_op() == ReduceOp::AVG) : p.reduce_op() != ReduceOp::SUM;
    if (!keeps) p = Replicate();
  }
  if (in_place && target != spec.placements) {
    fail(op, *stack, "would have to change the placements of its in-place output");
  }
  std::vector<at::Tensor> locals;
  for (const at::Tensor* t : {&self, &other}) {
    if (is_dtensor(*t)) locals.push_back(redistribute_local(detail::local_tensor(*t), dtensor_spec(*t), target));
  }
  call_local(op, stack, &locals);
  if (in_place) {
    stack->back() = self_v;
    return;
  }
  at::Tensor out = stack->back().toTensor();
  stack->back() = detail::make_dtensor(out, spec_with(spec, target, out.scalar_type()));
}

void add_out_of_place(const c10::OperatorHandle& op, Stack* stack) { add(op, stack, false); }
void add_in_place(const c10::OperatorHandle& op, Stack* stack) { add(op, stack, true); }

const OpRegistration registrations[] = {
    {"aten::detach", &alias_like},
    {"aten::alias", &alias_like},
    {"aten::clone", &alias_like},
    {"aten::_to_copy", &to_copy},
    {"aten::ones_like", &factory_like},
    {"aten::zeros_like", &factory_like},
    {"aten::empty_like", &factory_like},
    {"aten::full_like", &factory_like},
    {"aten::zero_", &zero_},
    {"aten::fill_.Scalar", &fill_},
    {"aten::fill_.Tensor", &fill_},
    {"aten::copy_", &copy_},
    {"aten::add.Tensor", &add_out_of_place},
    {"aten::add_.Tensor", &add_in_place},
};

}  // namespace
}  // namespace dtensor::ops
