#include "tensor/dtensor_impl.h"
#include "dtensor/core/error.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "dtensor/tensor/dtensor.h"

namespace dtensor::detail {
namespace {

void check_local_matches(const at::Tensor& local, const DTensorSpec& spec) {
  DTENSOR_CHECK(local.scalar_type() == spec.meta.dtype, "dtensor: local tensor dtype ",
                c10::toString(local.scalar_type()), " differs from the spec's ", c10::toString(spec.meta.dtype));
  DTENSOR_CHECK(local.dim() == spec.ndim(), "dtensor: local tensor has ", local.dim(), " dims, the spec ", spec.ndim());
  DTENSOR_CHECK(!local.requires_grad(), "dtensor: a DTensor's local tensor must not require grad");
}

// The device a DTensor reports: its local tensor's, except that a meta local on a CPU mesh (a plan dry run,
// dry_run.h) reports the CPU, as PyTorch's fake tensors do: LibTorch's device-keyed choices (the CPU
// attention kernel scaled_dot_product_attention picks, for one) then take the path a real CPU run takes, and
// the locals stay meta (no memory).
c10::Device reported_device(const at::Tensor& local, const DTensorSpec& spec) {
  if (local.is_meta() && spec.mesh.device_type() == "cpu") return c10::Device(c10::kCPU);
  return local.device();
}
}  // namespace

DTensorImpl::DTensorImpl(at::Tensor local, DTensorSpec spec)
    : c10::TensorImpl(c10::DispatchKeySet(kDTensorKey), local.dtype(), reported_device(local, spec)),
      local_(std::move(local)), spec_(std::move(spec)) {
  check_local_matches(local_, spec_);
  set_storage_access_should_throw();
  set_sizes_and_strides(spec_.meta.shape, spec_.meta.stride);
}

void DTensorImpl::replace(at::Tensor local, DTensorSpec spec) {
  check_local_matches(local, spec);
  DTENSOR_CHECK(spec.meta.shape == spec_.meta.shape,
                "dtensor: an in-place update cannot change a DTensor's global shape");
  local_ = std::move(local);
  spec_ = std::move(spec);
  redistributed_.reset();
  set_sizes_and_strides(spec_.meta.shape, spec_.meta.stride);
}

const at::Tensor* DTensorImpl::cached_redistribution(const Placements& target) const {
  const auto& r = redistributed_;
  if (!r || r->target != target || r->version != local_._version()) return nullptr;
  return &r->local;
}

void DTensorImpl::cache_redistribution(const Placements& target, at::Tensor local) const {
  redistributed_ = std::make_shared<Redistributed>(Redistributed{target, std::move(local), static_cast<uint32_t>(local_._version())});
}

template <typename Version>
c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::copy_with(Version&& version, bool allow_metadata_change) const {
  auto impl = c10::make_intrusive<DTensorImpl>(local_, spec_);
  impl->redistributed_ = redistributed_;
  copy_tensor_metadata(this, impl.get(), std::forward<Version>(version), allow_metadata_change);
  impl->refresh_numel();
  return impl;
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  return copy_with(version_counter, allow_tensor_metadata_change);
}

c10::intrusive_ptr<c10::TensorImpl> DTensorImpl::shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                                         bool allow_tensor_metadata_change) const {
  return copy_with(std::move(version_counter), allow_tensor_metadata_change);
}

void DTensorImpl::shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) {
  auto* other = dynamic_cast<DTensorImpl*>(impl.get());
  DTENSOR_CHECK(other != nullptr, "dtensor: cannot set a DTensor's data to a plain tensor; distribute it first");
  copy_tensor_metadata(other, this, version_counter(), allow_tensor_metadata_change());
  local_ = other->local_;
  spec_ = other->spec_;
  refresh_numel();
}

DTensorImpl* get_impl(const at::Tensor& t) {
  if (!t.defined() || !t.key_set().has(kDTensorKey)) return nullptr;
  return dynamic_cast<DTensorImpl*>(t.unsafeGetTensorImpl());
}

at::Tensor make_dtensor(at::Tensor local, DTensorSpec spec, bool requires_grad) {
  at::Tensor t = at::detail::make_tensor<DTensorImpl>(std::move(local), std::move(spec));
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

const at::Tensor& local_tensor(const at::Tensor& dtensor) {
  auto* impl = get_impl(dtensor);
  DTENSOR_CHECK(impl, "dtensor: expected a DTensor, got a plain tensor");
  return impl->local();
}

}  // namespace dtensor::detail

namespace dtensor {

bool is_dtensor(const at::Tensor& tensor) { return detail::get_impl(tensor) != nullptr; }

const DTensorSpec& dtensor_spec(const at::Tensor& dtensor) {
  auto* impl = detail::get_impl(dtensor);
  DTENSOR_CHECK(impl, "dtensor: expected a DTensor, got a plain tensor");
  return impl->spec();
}

}  // namespace dtensor
