// Where the shards of a DTensor lie: torch.chunk arithmetic and shard regions, in one place. Every caller
// (distribute_tensor, from_local's checks, the redistribute planner, the op strategies, the collectives'
// default split sizes) uses these; nothing else computes chunk sizes or shard offsets.
//
//   chunk_sizes(10, 4)  = [3, 3, 3, 1]   torch.chunk: ceil-sized chunks, trailing ones short or empty
//   chunk_sizes(2, 4)   = [1, 1, 0, 0]
// Mesh dims that shard the same tensor dim apply in mesh-dim order, each splitting what the earlier ones
// left (PyTorch's nested sharding); an empty shard's offset is the dim's size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor {

// torch.chunk sizes of a dim of `dim_size` split `num_chunks` ways (trailing chunks may be 0).
std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t num_chunks);
// Offset of chunk `index` given every chunk's size (the sum of the sizes before it).
int64_t chunk_offset(const std::vector<int64_t>& sizes, int64_t index);
// Chunk `index` of `x` along `dim`, given every chunk's size (a view).
at::Tensor narrow_chunk(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes, int64_t index);

// The shard of the tensor at `coordinate` on the mesh: its shape and the global offset of its first element.
struct LocalShard {
  std::vector<int64_t> shape;
  std::vector<int64_t> offset;
};
LocalShard local_shard(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                       const std::vector<int64_t>& coordinate);
// This rank's shard (throws if the rank is not in the mesh).
LocalShard local_shard(const DTensorSpec& spec);

// Size along tensor dim `dim` of the region that the shards of mesh dims before `mesh_dim` leave the rank at
// `coordinate`: what mesh dim `mesh_dim` splits when it shards `dim`.
int64_t region_size(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                    int64_t mesh_dim, int64_t dim, const std::vector<int64_t>& coordinate);

}  // namespace dtensor
