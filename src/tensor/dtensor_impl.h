// DTensorImpl: the TensorImpl behind a DTensor. No storage; global sizes/strides; holds the local shard
// (a plain tensor, never tracking autograd history itself) and the spec. Internal header.
#pragma once

#include <c10/core/TensorImpl.h>

#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor::detail {

// The key every DTensor carries. PrivateUse1 is the backend key PyTorch reserves for out-of-tree
// backends; the wrapper still reports the local tensor's device (CPU), so device checks pass.
constexpr c10::DispatchKey kDTensorKey = c10::DispatchKey::PrivateUse1;

class DTensorImpl final : public c10::TensorImpl {
 public:
  DTensorImpl(at::Tensor local, DTensorSpec spec);

  const at::Tensor& local() const { return local_; }
  const DTensorSpec& spec() const { return spec_; }
  // In-place and out= ops: the wrapper keeps its identity, its contents change.
  void replace(at::Tensor local, DTensorSpec spec);

  // The last redistribution an op asked of this DTensor when it held a Partial (run_strategy): an op that saved
  // the DTensor for backward (layer_norm after a Rowwise output) asks the same there, and gets it with no
  // second all-reduce. Valid while the local tensor is unchanged (its version counter); null otherwise.
  const at::Tensor* cached_redistribution(const Placements& target) const;
  void cache_redistribution(const Placements& target, at::Tensor local) const;

  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(const c10::VariableVersion& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  c10::intrusive_ptr<c10::TensorImpl> shallow_copy_and_detach(c10::VariableVersion&& version_counter,
                                                              bool allow_tensor_metadata_change) const override;
  void shallow_copy_from(const c10::intrusive_ptr<c10::TensorImpl>& impl) override;

 private:
  const char* tensorimpl_type_name() const override { return "DTensorImpl"; }
  template <typename Version>
  c10::intrusive_ptr<c10::TensorImpl> copy_with(Version&& version, bool allow_metadata_change) const;

  at::Tensor local_;
  DTensorSpec spec_;
  struct Redistributed {
    Placements target;
    at::Tensor local;
    uint32_t version = 0;
  };
  mutable std::shared_ptr<Redistributed> redistributed_;  // shared by shallow copies (same local_)
};

DTensorImpl* get_impl(const at::Tensor& t);  // nullptr when not a DTensor

}  // namespace dtensor::detail
