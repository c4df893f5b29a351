// Turning a module's parameters into DTensors (or local shards), shared by the styles and distribute_module.
#pragma once

#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tensor/placement.h"

namespace dtensor::detail {

// Re-creates each named parameter registered directly on `module` as a DTensor with its placements (the
// source rank's values are the truth). Absent or undefined parameters are skipped (a Linear without bias).
void distribute_params(torch::nn::Module& module, const DeviceMesh& mesh,
                       const std::vector<std::pair<std::string, Placements>>& placements, std::optional<int> src);

// Every parameter registered directly on `module` that is still a plain tensor (and every buffer, when
// `buffers`) becomes a DTensor replicated on every mesh dim.
void replicate_params(torch::nn::Module& module, const DeviceMesh& mesh, std::optional<int> src, bool buffers);

// Rank r's part of dim `dim` of a packed tensor: the dim is made of parts sized in the proportions
// `parts`; each part is torch.chunk'ed over n ranks and rank r keeps its piece of every part, in order.
// parts {1} is a plain torch.chunk. Throws when the dim does not divide into the parts.
std::vector<int64_t> packed_indices(int64_t size, const std::vector<int64_t>& parts, int64_t n, int64_t r,
                                    const std::string& what);

// This rank's packed part of dim `dim` of `full` on the 1-D `mesh` (packed_indices, then index_select).
at::Tensor packed_slice(const at::Tensor& full, int64_t dim, const std::vector<int64_t>& parts, const DeviceMesh& mesh,
                        const std::string& what);

}  // namespace dtensor::detail
