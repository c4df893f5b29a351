// The NCCL process group behind a group's CUDA tensors. The only translation unit that includes
// ProcessGroupNCCL.hpp (and with it CUDA's and NCCL's headers); it is part of the CUDA plugin.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "cuda/nccl_backend.h"

namespace dtensor::detail::cuda {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
                                                    int group_size, std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  // NCCL's watchdog aborts a collective that outlives this, naming it (op type, sequence number, sizes);
  // with TORCH_NCCL_BLOCKING_WAIT=1, Work::wait itself throws instead (at the cost of a host sync).
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, group_rank, group_size, options);
}

}  // namespace dtensor::detail::cuda
