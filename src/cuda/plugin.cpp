// libdtensor_cuda.so: the CUDA side of the library, loaded by mesh/cuda_support.cpp on first use. Linking
// it brings in LibTorch's CUDA libraries, whose kernels register themselves when it loads.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "cuda/nccl_backend.h"
#include "mesh/cuda_support.h"

namespace dtensor::detail::cuda {
namespace {

class Plugin final : public CudaSupport {
 public:
  int device_count() const override { return static_cast<int>(c10::cuda::device_count()); }
  void set_device(int index) const override { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }
  c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
                                                      int group_size,
                                                      std::chrono::milliseconds timeout) const override {
    return cuda::make_nccl_backend(store, group_rank, group_size, timeout);
  }
};

}  // namespace
}  // namespace dtensor::detail::cuda

extern "C" __attribute__((visibility("default"))) const dtensor::detail::CudaSupport* dtensor_cuda_support_v1() {
  static const dtensor::detail::cuda::Plugin plugin;
  return &plugin;
}
