#include "common/dtype.h"

#include <ATen/ATen.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/cuda.h"

namespace models {

const std::vector<std::string>& dtype_names() {
  static const std::vector<std::string> names = {"auto", "bfloat16", "float16", "float32"};
  return names;
}

at::ScalarType dtype_from_name(const std::string& name) {
  const std::string bare = name.rfind("torch.", 0) == 0 ? name.substr(6) : name;
  if (bare == "bfloat16") return at::kBFloat16;
  if (bare == "float16") return at::kHalf;
  if (bare == "float32") return at::kFloat;
  if (bare.rfind("float8", 0) == 0) {
    throw DTENSOR_ERROR("dtensor: dtype '", name, "' is a storage format, not one a model computes in (",
                        "bfloat16, float16 or float32)");
  }
  throw DTENSOR_ERROR("dtensor: dtype '", name, "' is not supported (bfloat16, float16 or float32)");
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: throw DTENSOR_ERROR("dtensor: dtype ", c10::toString(dtype), " is not one a model is kept in (",
                                 "float32, bfloat16 or float16)");
  }
}

at::ScalarType resolve_dtype(const std::string& requested, const std::string& checkpoint_dtype) {
  if (requested != "auto") return dtype_from_name(requested);
  if (checkpoint_dtype.empty()) return at::kFloat;
  try {
    return dtype_from_name(checkpoint_dtype);
  } catch (const dtensor::Error& e) {
    throw DTENSOR_ERROR("dtensor: --dtype auto: the checkpoint's dtype '", checkpoint_dtype,
                        "' is not one we compute in; name one (bfloat16, float16 or float32)");
  }
}

void check_computable(at::ScalarType dtype, c10::Device device) {
  dtype_name(dtype);  // one of ours
  // CUDA's kernels register when the plugin loads (dtensor/mesh/cuda.h): ask it first, and say why there is none.
  if (device.is_cuda() && !dtensor::cuda_available()) {
    throw DTENSOR_ERROR("dtensor: no CUDA device to compute on: ", dtensor::cuda_unavailable_reason());
  }
  // What the model needs of the device in this dtype: a matmul and a softmax. A tiny one, tried: a device that cannot
  // (a GPU before bf16, a backend without the kernel) fails here, before anything is loaded.
  try {
    const at::Tensor x = at::ones({2, 2}, at::TensorOptions().dtype(dtype).device(device));
    at::softmax(at::matmul(x, x), -1).sum().item<double>();
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: ", device.str(), " cannot compute in ", dtype_name(dtype), ": ", e.what());
  }
}

}  // namespace models
