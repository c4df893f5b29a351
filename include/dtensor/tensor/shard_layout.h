// Where the shards of a DTensor lie: torch.chunk arithmetic and shard regions, in one place. Every caller
// (distribute_tensor, from_local's checks, the redistribute planner, the op strategies, the collectives'
// default split sizes) uses these; nothing else computes chunk sizes or shard offsets.
//
//   chunk_sizes(10, 4)  = [3, 3, 3, 1]   torch.chunk: ceil-sized chunks, trailing ones short or empty
//   chunk_sizes(2, 4)   = [1, 1, 0, 0]
// Mesh dims that shard the same tensor dim apply in mesh-dim order, each splitting what the earlier ones
// left (PyTorch's nested sharding); an empty shard's offset is the dim's size.
//
// _StridedShard(d, sf) on mesh dim i (PyTorch's `_StridedShard._split_tensor`) splits what the earlier
// mesh dims left of d into sf torch.chunk pieces, each piece into size(i) torch.chunk pieces, and gives
// coordinate c the concatenation of every piece's c-th piece. Its shard need not be one box: along d it is
// a list of runs of global indices, in local order (shard_runs). Example, 8 rows on ("dp", "tp") = 2 x 2:
//   (_StridedShard(0, sf=2), Shard(0)): dp rank i holds rows {2i, 2i+1, 4+2i, 5+2i}, then tp rank j the
//   j-th half of those: rank (i, j) holds rows [4j+2i, 4j+2i+2) -- FSDP's dp-chunk i of TP's chunk j.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dtensor/core/chunking.h"
#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor {

// The shard of the tensor at `coordinate` on the mesh: its shape and the global offset of its first element.
// `box` is false when a _StridedShard leaves it in several runs along some dim: `offset` is then the first
// element's (PyTorch's compute_local_shape_and_global_offset) and the shard is not the box offset + shape;
// callers that place data by box must check it (or use shard_runs).
struct LocalShard {
  std::vector<int64_t> shape;
  std::vector<int64_t> offset;
  bool box = true;
};
LocalShard local_shard(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                       const std::vector<int64_t>& coordinate);
// This rank's shard (throws if the rank is not in the mesh).
LocalShard local_shard(const DTensorSpec& spec);

// A shard's global indices along one tensor dim: runs [start, start + length) in local order, adjacent
// runs merged, empty ones dropped (so a plain Shard leaves at most one run).
struct Run {
  int64_t start;
  int64_t length;
  bool operator==(const Run& o) const { return start == o.start && length == o.length; }
};
using Runs = std::vector<Run>;
// The runs of the shard at `coordinate`, per tensor dim (PyTorch's left-to-right placement semantics,
// _StridedShard included). The general path; local_shard computes plain layouts arithmetically.
std::vector<Runs> shard_runs(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh,
                             const Placements& placements, const std::vector<int64_t>& coordinate);
// Piece `index` of `runs` split `num_chunks` ways by the Shard or _StridedShard `placement` (one mesh dim's
// step of shard_runs; on Runs{{0, n}} it names positions within a local tensor of n along the dim).
Runs split_runs(const Runs& runs, const Placement& placement, int64_t num_chunks, int64_t index);
// The indices that runs cover, in local order (for index_select / index_put), and how many.
std::vector<int64_t> run_indices(const Runs& runs);
int64_t run_length(const Runs& runs);
// The elements of `x` at the indices `runs` cover along `dim`, in their order: a view for at most one run.
at::Tensor select_runs(const at::Tensor& x, int64_t dim, const Runs& runs);

// Size along tensor dim `dim` of the region that the shards of mesh dims before `mesh_dim` leave the rank at
// `coordinate`: what mesh dim `mesh_dim` splits when it shards `dim`.
int64_t region_size(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                    int64_t mesh_dim, int64_t dim, const std::vector<int64_t>& coordinate);

}  // namespace dtensor
