// torch.chunk arithmetic: how a dim of n elements splits k ways. Plain integers (and one view), below every
// layer that cuts tensors: the collectives' default split sizes (mesh/), where shards lie (tensor/shard_layout.h)
// and everything above.
//
//   chunk_sizes(10, 4) = [3, 3, 3, 1]   ceil-sized chunks, trailing ones short or empty
//   chunk_sizes(2, 4)  = [1, 1, 0, 0]
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace dtensor {

// torch.chunk sizes of a dim of `dim_size` split `num_chunks` ways (trailing chunks may be 0).
std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t num_chunks);
// Offset of chunk `index` given every chunk's size (the sum of the sizes before it).
int64_t chunk_offset(const std::vector<int64_t>& sizes, int64_t index);
// Chunk `index` of `x` along `dim`, given every chunk's size (a view).
at::Tensor narrow_chunk(const at::Tensor& x, int64_t dim, const std::vector<int64_t>& sizes, int64_t index);

}  // namespace dtensor
