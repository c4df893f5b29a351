#include "dtensor/tp/parallelized.h"
#include "dtensor/core/error.h"

#include "dtensor/api/dtensor_api.h"
#include "tp/style_support.h"

namespace dtensor::detail {

// The root's inputs and outputs move as a style's hooks move them (style_support.h).
at::Tensor parallelized_input(const at::Tensor& x, const DeviceMesh& mesh, const Placement& layout) {
  return !x.defined() || is_dtensor(x) ? x : prepare_input(x, mesh, layout, layout);
}

at::Tensor parallelized_output(const at::Tensor& y, const DeviceMesh& mesh, const Placement& layout, bool use_local) {
  return y.defined() ? prepare_output(y, mesh, layout, use_local) : y;
}

DeviceMesh mesh_of_parameters(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (is_dtensor(p)) return dtensor_spec(p).mesh;
  }
  throw DTENSOR_ERROR("dtensor: Parallelized: ", module.name(),
                      " has no DTensor parameters; call parallelize_module on it first, or pass the mesh");
}

}  // namespace dtensor::detail
