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

namespace {

// _StridedShard(d, sf) on mesh dim i splits after the later mesh dims that shard d (placement.h): those must
// all be later, plain Shard(d), and together sf ranks wide. (PyTorch's general _StridedShard allows more;
// FSDP over TP needs this.)
void check_strided(const DeviceMesh& mesh, const Placements& placements, size_t i) {
  const int64_t d = placements[i].dim();
  int64_t later = 1;
  for (size_t j = 0; j < placements.size(); ++j) {
    if (j == i || !placements[j].is_shard(d)) continue;
    if (j < i || placements[j].is_strided_shard()) {
      throw dtensor::Error("dtensor: unsupported layout " + to_string(placements) + ": a _StridedShard must be the "
                           "outermost of the mesh dims that shard its tensor dim, the others plain Shard");
    }
    later *= mesh.size(static_cast<int64_t>(j));
  }
  if (later != placements[i].split_factor()) {
    throw dtensor::Error("dtensor: " + to_string(placements) + " on " + mesh.to_string() + ": the split factor " +
                         std::to_string(placements[i].split_factor()) + " is not the " + std::to_string(later) +
                         " ranks of the later mesh dims that shard dim " + std::to_string(d));
  }
}

}  // namespace

LocalShard local_shard(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                       const std::vector<int64_t>& coordinate) {
  LocalShard shard{global_shape, std::vector<int64_t>(global_shape.size(), 0)};
  // Plain shards in mesh order, then the strided ones: a _StridedShard splits what the later mesh dims
  // left (rank (i, j) of (_StridedShard(0, sf=tp), Shard(0)) holds dp-chunk i of tp-chunk j).
  for (bool strided : {false, true}) {
    for (size_t i = 0; i < placements.size(); ++i) {
      if (!placements[i].is_shard() || placements[i].is_strided_shard() != strided) continue;
      if (strided) check_strided(mesh, placements, i);
      int64_t d = placements[i].dim();
      // Split what the earlier mesh dims left of dim d, torch.chunk style, and keep piece coordinate[i].
      auto sizes = chunk_sizes(shard.shape[d], mesh.size(static_cast<int64_t>(i)));
      shard.offset[d] += chunk_offset(sizes, coordinate[i]);
      shard.shape[d] = sizes[coordinate[i]];
    }
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
