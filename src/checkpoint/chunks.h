// Chunks: the boxes of a tensor that ranks hold and files store, and their overlaps (the resharding planner
// is box intersection). A rank's box comes from shard_layout's local_shard, the one home of shard arithmetic.
//
//   saved at TP 2, Shard(0) of [6, 4]:   rank 0 wrote rows [0, 3), rank 1 rows [3, 6)
//   loaded at TP 4, Shard(1):            rank 2 holds [0, 6) x [2, 3): it reads rows [0, 3) x col 2 from
//                                        rank 0's file and rows [3, 6) x col 2 from rank 1's
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtensor::checkpoint::detail {

struct Box {
  std::vector<int64_t> offsets, sizes;
  int64_t numel() const;
  std::string to_string() const;  // "[0:3, 0:4]"
};

// The common part of two boxes of one tensor; nullopt when they do not overlap (or either is empty).
std::optional<Box> intersect(const Box& a, const Box& b);

// The view of `data`, which holds `region` of the tensor, restricted to `part` (inside `region`).
at::Tensor narrow_to(const at::Tensor& data, const Box& region, const Box& part);

// What this rank holds of `tensor`: the global box and the tensor with its values (a DTensor's local shard,
// a plain tensor itself). nullopt when the rank is outside the DTensor's mesh.
struct Held {
  Box box;
  at::Tensor data;
  // Partial(sum) mesh dims where this rank is not at coordinate 0: loading writes zeros there, so that the
  // sum over ranks is the stored value.
  bool zero_on_load = false;
};
std::optional<Held> held(const at::Tensor& tensor);

// Whether this rank writes its chunk of the `index`-th tensor of a save: one holder per distinct chunk. Along
// Replicate mesh dims the writer is the rank at coordinate index % size (spreading tensors over replicas);
// a plain tensor is written by world rank index % world_size. Empty chunks are never written. `tensor` has
// no Partial placements (save reduces them first).
bool writes_chunk(const at::Tensor& tensor, size_t index, int world_rank, int world_size);

}  // namespace dtensor::checkpoint::detail
