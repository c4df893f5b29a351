// The interface between the library and its CUDA plugin (libdtensor_cuda.so, src/cuda/), and the loader.
//
// The plugin exports one C symbol, dtensor_cuda_support_v1, returning its CudaSupport. The loader looks for
// the plugin beside libdtensor.so (then on the loader's search path), once per process.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace dtensor::detail {

class CudaSupport {
 public:
  virtual ~CudaSupport() = default;
  virtual int device_count() const = 0;
  virtual void set_device(int index) const = 0;
  // A ProcessGroupNCCL over `store` (a prefix store private to the group) for CUDA tensors of this group.
  // NCCL's communicator is created at the first collective, on the device of its tensors. Its watchdog
  // aborts a collective that outlives `timeout`.
  virtual c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                              int group_rank, int group_size,
                                                              std::chrono::milliseconds timeout) const = 0;
};

// The plugin, loaded on first use; nullptr when this build has none or it cannot be loaded (`why` says).
const CudaSupport* cuda_support(std::string* why = nullptr);

// The plugin's entry point.
extern "C" using CudaSupportEntry = const CudaSupport* (*)();
constexpr const char* kCudaSupportSymbol = "dtensor_cuda_support_v1";

}  // namespace dtensor::detail
