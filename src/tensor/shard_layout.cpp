#include "dtensor/tensor/shard_layout.h"

#include <algorithm>

#include "dtensor/error.h"

namespace dtensor {

std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t num_chunks) {
  if (num_chunks < 1) throw dtensor::Error("dtensor: chunk_sizes needs num_chunks >= 1");
  std::vector<int64_t> sizes(num_chunks, 0);
  if (dim_size == 0) return sizes;
  int64_t chunk = (dim_size + num_chunks - 1) / num_chunks;  // torch.chunk: ceil, trailing chunks short/empty
  for (int64_t i = 0; i < num_chunks; ++i) sizes[i] = std::clamp<int64_t>(dim_size - i * chunk, 0, chunk);
  return sizes;
}

int64_t chunk_offset(const std::vector<int64_t>& sizes, int64_t index) {
  int64_t offset = 0;
  for (int64_t k = 0; k < index; ++k) offset += sizes[k];
  return offset;
}

at::Tensor narrow_chunk(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes, int64_t index) {
  return x.narrow(dim, chunk_offset(sizes, index), sizes[index]);
}

LocalShard local_shard(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                       const std::vector<int64_t>& coordinate) {
  LocalShard shard{global_shape, std::vector<int64_t>(global_shape.size(), 0)};
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    int64_t d = placements[i].dim();
    // Split what the earlier mesh dims left of dim d, torch.chunk style, and keep piece coordinate[i].
    auto sizes = chunk_sizes(shard.shape[d], mesh.size(static_cast<int64_t>(i)));
    shard.offset[d] += chunk_offset(sizes, coordinate[i]);
    shard.shape[d] = sizes[coordinate[i]];
  }
  // An empty shard sits at the end of its dim (PyTorch's convention), wherever its region was.
  for (size_t d = 0; d < global_shape.size(); ++d) {
    if (shard.shape[d] == 0) shard.offset[d] = global_shape[d];
  }
  return shard;
}

LocalShard local_shard(const DTensorSpec& spec) {
  auto coordinate = spec.mesh.get_coordinate();
  if (!coordinate) {
    throw dtensor::Error("dtensor: rank " + std::to_string(spec.mesh.get_rank()) + " is not in " +
                             spec.mesh.to_string());
  }
  return local_shard(spec.meta.shape, spec.mesh, spec.placements, *coordinate);
}

int64_t region_size(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                    int64_t mesh_dim, int64_t dim, const std::vector<int64_t>& coordinate) {
  int64_t size = global_shape[dim];
  for (int64_t j = 0; j < mesh_dim; ++j) {
    if (placements[j].is_shard(dim)) size = chunk_sizes(size, mesh.size(j))[coordinate[j]];
  }
  return size;
}

}  // namespace dtensor
