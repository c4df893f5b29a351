#include "dtensor/tp/parallelized.h"
#include "dtensor/core/error.h"

#include "dtensor/api/dtensor_api.h"

namespace dtensor::detail {

at::Tensor parallelized_input(const at::Tensor& x, const DeviceMesh& mesh, const Placement& layout) {
  if (!x.defined() || is_dtensor(x)) return x;
  return DTensor::from_local(x, mesh, {layout});
}

at::Tensor parallelized_output(const at::Tensor& y, const DeviceMesh& mesh, const Placement& layout, bool use_local) {
  if (!y.defined() || !is_dtensor(y)) return y;
  at::Tensor out = placements(y)[0] == layout.normalized(y.dim()) ? y : redistribute(y, mesh, {layout});
  return use_local ? to_local(out) : out;
}

DeviceMesh mesh_of_parameters(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) {
    if (is_dtensor(p)) return dtensor_spec(p).mesh;
  }
  throw DTENSOR_ERROR("dtensor: Parallelized: ", module.name(),
                      " has no DTensor parameters; call parallelize_module on it first, or pass the mesh");
}

}  // namespace dtensor::detail
