#include "tp/distribute_params.h"
#include "dtensor/core/error.h"

#include <numeric>
#include <stdexcept>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/tensor/shard_layout.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/api/dtensor_api.h"

namespace dtensor::detail {

void distribute_params(torch::nn::Module& module, const DeviceMesh& mesh,
                       const std::vector<std::pair<std::string, Placements>>& placements, std::optional<int> src) {
  for (const auto& [name, p] : placements) {
    auto params = module.named_parameters(/*recurse=*/false);
    if (!params.contains(name)) continue;
    const at::Tensor& old = params[name];
    if (!old.defined()) continue;
    at::Tensor dt = distribute_tensor(old.detach(), mesh, p, src);
    dt.set_requires_grad(old.requires_grad());
    nn::replace_parameter(module, name, dt);
  }
}

void replicate_params(torch::nn::Module& module, const DeviceMesh& mesh, std::optional<int> src, bool buffers) {
  const Placements replicated(mesh.ndim(), Replicate());
  std::vector<std::pair<std::string, Placements>> plain;
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    if (p.value().defined() && !is_dtensor(p.value())) plain.emplace_back(p.key(), replicated);
  }
  distribute_params(module, mesh, plain, src);
  if (!buffers) return;
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (!b.value().defined() || is_dtensor(b.value())) continue;
    nn::replace_buffer(module, b.key(), distribute_tensor(b.value(), mesh, replicated, src));
  }
}

std::vector<int64_t> packed_indices(int64_t size, const std::vector<int64_t>& parts, int64_t n, int64_t r,
                                    const std::string& what) {
  const int64_t total = std::accumulate(parts.begin(), parts.end(), int64_t{0});
  if (parts.empty() || total <= 0 || size % total != 0) {
    std::string list;
    for (int64_t p : parts) list += (list.empty() ? "" : ", ") + std::to_string(p);
    throw DTENSOR_ERROR("dtensor: ", what, ": a dim of size ", size,
                        " does not split into packed parts in the proportions {", list, "}");
  }
  std::vector<int64_t> out;
  int64_t part_start = 0;
  for (int64_t p : parts) {
    const int64_t part_size = size / total * p;
    const auto sizes = chunk_sizes(part_size, n);
    const int64_t start = part_start + std::accumulate(sizes.begin(), sizes.begin() + r, int64_t{0});
    for (int64_t k = 0; k < sizes[r]; ++k) out.push_back(start + k);
    part_start += part_size;
  }
  return out;
}

at::Tensor packed_slice(const at::Tensor& full, int64_t dim, const std::vector<int64_t>& parts, const DeviceMesh& mesh,
                        const std::string& what) {
  auto idx = packed_indices(full.size(dim), parts, mesh.size(0), mesh.get_local_rank(0), what);
  return full.index_select(dim, at::tensor(idx, at::kLong).to(full.device()));
}

}  // namespace dtensor::detail
