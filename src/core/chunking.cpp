#include "dtensor/core/chunking.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dtensor/core/error.h"

namespace dtensor {

std::vector<int64_t> chunk_sizes(int64_t dim_size, int64_t num_chunks) {
  DTENSOR_CHECK(num_chunks >= 1, "dtensor: chunk_sizes needs num_chunks >= 1");
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

}  // namespace dtensor
