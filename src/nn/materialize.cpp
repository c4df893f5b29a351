#include "dtensor/nn/materialize.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <optional>
#include <unordered_map>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/tensor/dtensor.h"

namespace dtensor::nn {
namespace {

bool on_meta(const at::Tensor& t) {
  if (!t.defined()) return false;
  return is_dtensor(t) ? detail::local_tensor(t).is_meta() : t.is_meta();
}

// Storage on `device` for meta tensor `t`: its local shard's shape, in `dtype` when `t` is floating and one is given
// (a DTensor keeps its spec, with the new dtype in its meta).
at::Tensor empty_like_on(const at::Tensor& t, at::Device device, std::optional<at::ScalarType> dtype) {
  const at::ScalarType to = dtype && at::isFloatingType(t.scalar_type()) ? *dtype : t.scalar_type();
  if (!is_dtensor(t)) return at::empty(t.sizes(), t.options().device(device).dtype(to));
  const at::Tensor& local = detail::local_tensor(t);
  DTensorSpec spec = dtensor_spec(t);
  spec.meta.dtype = to;
  return detail::make_dtensor(at::empty(local.sizes(), local.options().device(device).dtype(to)), std::move(spec));
}

// The post-accumulate-grad hook of meta parameter `from` (a TP plan's gradient sync) moves to its replacement `to`,
// so a plan applied on the meta device reduces the materialized parameters' gradients as it would have the meta
// ones'. Gradient hooks (Tensor.register_hook) are refused: register them on the materialized parameter.
void move_autograd_hooks(const at::Tensor& from, const at::Tensor& to) {
  if (!from.requires_grad()) return;
  DTENSOR_CHECK(torch::autograd::impl::hooks(from).empty(),
                "dtensor: to_empty: a meta parameter of shape ", from.sizes(),
                " has gradient hooks (register_hook); register them after to_empty");
  auto& post = torch::autograd::impl::post_acc_grad_hooks(from);
  if (post) torch::autograd::impl::set_post_acc_grad_hooks(to, std::move(post));
}

}  // namespace

int64_t to_empty(torch::nn::Module& module, at::Device device, std::optional<at::ScalarType> dtype) {
  at::NoGradGuard no_grad;
  // One new tensor per meta tensor, whatever the number of places it is registered in.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> made;
  int64_t bytes = 0;
  auto materialize = [&](const at::Tensor& t) {
    auto [it, fresh] = made.try_emplace(t.unsafeGetTensorImpl());
    if (fresh) {
      it->second = empty_like_on(t, device, dtype);
      const at::Tensor& local = is_dtensor(it->second) ? detail::local_tensor(it->second) : it->second;
      bytes += static_cast<int64_t>(local.nbytes());
      if (t.requires_grad()) it->second.set_requires_grad(true);
      move_autograd_hooks(t, it->second);
    }
    return it->second;
  };
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    torch::nn::Module& m = *item.value();
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      if (on_meta(p.value())) replace_parameter(m, p.key(), materialize(p.value()));
    }
    for (const auto& b : m.named_buffers(/*recurse=*/false)) {
      if (on_meta(b.value())) replace_buffer(m, b.key(), materialize(b.value()));
    }
  }
  return bytes;
}

int64_t meta_bytes(torch::nn::Module& module, std::optional<at::ScalarType> dtype) {
  std::unordered_map<const c10::TensorImpl*, bool> seen;
  int64_t bytes = 0;
  auto count = [&](const at::Tensor& t) {
    if (!on_meta(t) || !seen.try_emplace(t.unsafeGetTensorImpl(), true).second) return;
    const at::Tensor& local = is_dtensor(t) ? detail::local_tensor(t) : t;
    const at::ScalarType to = dtype && at::isFloatingType(t.scalar_type()) ? *dtype : t.scalar_type();
    bytes += local.numel() * static_cast<int64_t>(c10::elementSize(to));
  };
  for (const auto& p : module.parameters(/*recurse=*/true)) count(p);
  for (const auto& b : module.buffers(/*recurse=*/true)) count(b);
  return bytes;
}

void copy_from_full_(const at::Tensor& dst, const at::Tensor& full) {
  at::NoGradGuard no_grad;
  DTENSOR_CHECK(dst.sizes() == full.sizes(), "dtensor: copy_from_full_: the full value has shape ", full.sizes(),
                ", the tensor ", dst.sizes());
  if (!is_dtensor(dst)) {
    dst.copy_(full);
    return;
  }
  const DTensorSpec& spec = dtensor_spec(dst);
  // No source rank: each rank cuts its own part of the value it holds (every rank holds the same full value).
  const at::Tensor part = distribute_tensor(full, spec.mesh, spec.placements, /*src_data_rank=*/std::nullopt);
  detail::local_tensor(dst).copy_(detail::local_tensor(part));
}

}  // namespace dtensor::nn
