// CUDA support: whether this build has it and whether this process can use a GPU.
//
// The library's CUDA parts (the NCCL process groups, device selection) live in a plugin, libdtensor_cuda.so,
// built when the LibTorch found at build time has CUDA and loaded the first time something asks for CUDA
// (a "cuda" mesh, a CUDA tensor in a collective, or one of these functions). CPU-only jobs never load
// LibTorch's CUDA libraries; a build against a CPU-only LibTorch has no plugin and says so here.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace dtensor {

// The plugin was built (LibTorch had CUDA at build time).
bool cuda_built();
// Built, loadable, and at least one GPU visible to this process.
bool cuda_available();
// GPUs visible to this process (0 when CUDA is unavailable).
int cuda_device_count();
// Why CUDA is unavailable ("" when it is available).
std::string cuda_unavailable_reason();
// The GPU this process uses, as torchrun's one-process-per-GPU convention: cuda:(LOCAL_RANK % device count)
// (LOCAL_RANK 0 when unset), made current for the calling thread. Throws when CUDA is unavailable.
c10::Device select_cuda_device();

}  // namespace dtensor
