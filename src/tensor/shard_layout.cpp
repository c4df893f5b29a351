#include "dtensor/tensor/shard_layout.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dtensor/core/error.h"

namespace dtensor {

namespace {

// Local positions [begin, begin + length) of the indices `runs` hold.
Runs take(const Runs& runs, int64_t begin, int64_t length) {
  Runs out;
  for (const Run& r : runs) {
    if (length <= 0) break;
    if (begin >= r.length) {
      begin -= r.length;
      continue;
    }
    const int64_t n = std::min(r.length - begin, length);
    out.push_back({r.start + begin, n});
    length -= n;
    begin = 0;
  }
  return out;
}

void append(Runs& out, const Runs& more) {
  for (const Run& r : more) {
    if (r.length == 0) continue;
    if (!out.empty() && out.back().start + out.back().length == r.start) {
      out.back().length += r.length;
    } else {
      out.push_back(r);
    }
  }
}

}  // namespace

int64_t run_length(const Runs& runs) {
  int64_t n = 0;
  for (const Run& r : runs) n += r.length;
  return n;
}

// Piece `c` of `runs` split `n` ways by `p`: torch.chunk for Shard; for _StridedShard(d, sf), sf torch.chunk
// pieces, each split n ways, piece c of each concatenated (PyTorch's _StridedShard._split_tensor).
Runs split_runs(const Runs& runs, const Placement& p, int64_t n, int64_t c) {
  const int64_t size = run_length(runs);
  Runs out;
  if (!p.is_strided_shard()) {
    const auto sizes = chunk_sizes(size, n);
    append(out, take(runs, chunk_offset(sizes, c), sizes[c]));
    return out;
  }
  const auto first = chunk_sizes(size, p.split_factor());
  for (int64_t j = 0; j < p.split_factor(); ++j) {
    const auto second = chunk_sizes(first[j], n);
    append(out, take(runs, chunk_offset(first, j) + chunk_offset(second, c), second[c]));
  }
  return out;
}

std::vector<Runs> shard_runs(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh,
                             const Placements& placements, const std::vector<int64_t>& coordinate) {
  std::vector<Runs> runs;
  for (int64_t size : global_shape) runs.push_back(size > 0 ? Runs{{0, size}} : Runs{});
  // Mesh dims in order, each splitting what the earlier ones left of its tensor dim.
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    Runs& r = runs.at(static_cast<size_t>(placements[i].dim()));
    r = split_runs(r, placements[i], mesh.size(static_cast<int64_t>(i)), coordinate[i]);
  }
  return runs;
}

std::vector<int64_t> run_indices(const Runs& runs) {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(run_length(runs)));
  for (const Run& r : runs) {
    for (int64_t k = 0; k < r.length; ++k) out.push_back(r.start + k);
  }
  return out;
}

at::Tensor select_runs(const at::Tensor& x, int64_t dim, const Runs& runs) {
  if (runs.empty()) return x.narrow(dim, 0, 0);
  if (runs.size() == 1) return x.narrow(dim, runs[0].start, runs[0].length);
  return x.index_select(dim, at::tensor(run_indices(runs), x.options().dtype(at::kLong)));
}

LocalShard local_shard(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                       const std::vector<int64_t>& coordinate) {
  LocalShard shard{global_shape, std::vector<int64_t>(global_shape.size(), 0)};
  if (has_strided_shard(placements)) {
    // The general path: the runs, and the first one's start as the offset.
    const auto runs = shard_runs(global_shape, mesh, placements, coordinate);
    for (size_t d = 0; d < global_shape.size(); ++d) {
      shard.shape[d] = run_length(runs[d]);
      shard.offset[d] = runs[d].empty() ? global_shape[d] : runs[d].front().start;
      shard.box = shard.box && runs[d].size() <= 1;
    }
    return shard;
  }
  // Plain shards: one box; each mesh dim splits what the earlier ones left of dim d, torch.chunk style, and
  // keeps piece coordinate[i] (shard_runs computes the same; tests compare the two).
  for (size_t i = 0; i < placements.size(); ++i) {
    if (!placements[i].is_shard()) continue;
    const int64_t d = placements[i].dim();
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
  DTENSOR_CHECK(coordinate, "dtensor: rank ", spec.mesh.get_rank(), " is not in ", spec.mesh.to_string());
  return local_shard(spec.meta.shape, spec.mesh, spec.placements, *coordinate);
}

int64_t region_size(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh, const Placements& placements,
                    int64_t mesh_dim, int64_t dim, const std::vector<int64_t>& coordinate) {
  Placements earlier(placements.begin(), placements.begin() + mesh_dim);
  for (int64_t j = 0; j < mesh_dim; ++j) {
    if (!earlier[j].is_shard(dim)) earlier[j] = Replicate();  // only the splits of `dim` matter
  }
  std::vector<int64_t> coord(coordinate.begin(), coordinate.begin() + mesh_dim);
  return local_shard(global_shape, mesh, earlier, coord).shape[dim];
}

}  // namespace dtensor
