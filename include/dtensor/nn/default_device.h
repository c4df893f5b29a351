// The device new layer parameters go to (PyTorch's `with torch.device("meta"):`). LibTorch has no default
// device, so the layers of layers.h read this guard when they build their parameters.
#pragma once

#include <c10/core/Device.h>

#include <optional>

namespace dtensor::nn {

// While alive on this thread, Linear, Embedding and RMSNorm below create their parameters on `device`
// (PyTorch's `with torch.device("meta"):`, limited to these layers: LibTorch has no default device). On
// the meta device a model of any size costs no memory: the plan dry run builds its models so
// (dtensor/plan/dry_run.h). Initialization runs on that device (on meta it computes nothing).
class DefaultDeviceGuard {
 public:
  explicit DefaultDeviceGuard(at::Device device);
  ~DefaultDeviceGuard();
  DefaultDeviceGuard(const DefaultDeviceGuard&) = delete;
  DefaultDeviceGuard& operator=(const DefaultDeviceGuard&) = delete;
  // The device set by the innermost guard, if any.
  static std::optional<at::Device> current();

 private:
  std::optional<at::Device> previous_;
};

}  // namespace dtensor::nn
