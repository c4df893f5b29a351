// Loads the CUDA plugin (libdtensor_cuda.so) on first use, and the public queries of dtensor/mesh/cuda.h.
#include "mesh/cuda_support.h"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

#include "dtensor/core/error.h"
#include "dtensor/mesh/cuda.h"
#include <cstdlib>

namespace dtensor {
namespace detail {
namespace {

struct Loaded {
  const CudaSupport* support = nullptr;
  std::string why;
};

// The directory holding libdtensor.so (this code's own shared object).
std::filesystem::path library_dir() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&cuda_support), &info) == 0 || info.dli_fname == nullptr) return {};
  return std::filesystem::path(info.dli_fname).parent_path();
}

Loaded load() {
  Loaded out;
#ifndef DTENSOR_CUDA_BUILT
  out.why = "this build of dtensor has no CUDA support (the LibTorch it was built against had no CUDA)";
  return out;
#else
  const std::filesystem::path beside = library_dir() / "libdtensor_cuda.so";
  const std::string path = std::filesystem::exists(beside) ? beside.string() : std::string("libdtensor_cuda.so");
  // RTLD_GLOBAL: LibTorch's CUDA libraries, which the plugin brings in, register their kernels for everyone.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    out.why = "could not load the CUDA plugin " + path + ": " + (err ? err : "unknown error");
    return out;
  }
  auto entry = reinterpret_cast<CudaSupportEntry>(dlsym(handle, kCudaSupportSymbol));
  if (entry == nullptr) {
    out.why = "the CUDA plugin " + path + " has no " + kCudaSupportSymbol + " (a plugin from another build?)";
    return out;
  }
  out.support = entry();
  if (out.support->device_count() == 0) out.why = "no CUDA device is visible to this process";
  return out;
#endif
}

const Loaded& loaded() {
  static std::once_flag once;
  static Loaded state;
  std::call_once(once, [] { state = load(); });
  return state;
}

// LOCAL_RANK as torchrun sets it (0 when unset, as for a process started by hand).
int local_rank_from_environ() {
  const char* v = std::getenv("LOCAL_RANK");
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  DTENSOR_CHECK(*end == '\0' && r >= 0, "dtensor: LOCAL_RANK=", v, " is not a rank");
  return static_cast<int>(r);
}

}  // namespace

const CudaSupport* cuda_support(std::string* why) {
  const Loaded& l = loaded();
  if (why) *why = l.why;
  return l.support;
}

}  // namespace detail

bool cuda_built() {
#ifdef DTENSOR_CUDA_BUILT
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
  const detail::CudaSupport* s = detail::cuda_support();
  return s ? s->device_count() : 0;
}

bool cuda_available() { return cuda_device_count() > 0; }

std::string cuda_unavailable_reason() {
  std::string why;
  detail::cuda_support(&why);
  return why;
}

c10::Device select_cuda_device() {
  std::string why;
  const detail::CudaSupport* s = detail::cuda_support(&why);
  DTENSOR_CHECK(s && s->device_count() != 0, "dtensor: CUDA is unavailable: ", why);
  const int index = detail::local_rank_from_environ() % s->device_count();
  s->set_device(index);
  return c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
}

}  // namespace dtensor
