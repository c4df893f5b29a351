// DDP as a function (include/dtensor/dp/replicate.h): gradient_sync with its data-parallel stage.
#include "dtensor/dp/replicate.h"

#include <algorithm>

#include "dtensor/core/error.h"
#include "dtensor/dp/gradient_sync.h"

namespace dtensor {

DeviceMesh data_parallel_mesh(const DeviceMesh& mesh) {
  if (mesh.ndim() == 1) return mesh;
  const auto& names = mesh.mesh_dim_names();
  DTENSOR_CHECK(std::find(names.begin(), names.end(), "dp") != names.end(),
                "dtensor: data parallel needs a 1-D mesh or a mesh with a \"dp\" dim, got ", mesh.to_string());
  return mesh["dp"];
}

void replicate(torch::nn::Module& module, const DeviceMesh& mesh, ReplicateOptions options) {
  const DeviceMesh dp = data_parallel_mesh(mesh);
  DTENSOR_CHECK(options.bucket_cap_bytes > 0, "dtensor: replicate: bucket_cap_bytes must be positive, got ",
                options.bucket_cap_bytes);
  disable_gradient_sync(module);
  enable_gradient_sync(module, {.bucket_cap_bytes = options.bucket_cap_bytes, .data_parallel_mesh = dp});
}

}  // namespace dtensor
