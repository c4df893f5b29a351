// ProcessGroupNCCL for one group's CUDA tensors (see mesh/cuda_support.h).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace dtensor::detail::cuda {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int group_rank,
                                                    int group_size, std::chrono::milliseconds timeout);

}  // namespace dtensor::detail::cuda
