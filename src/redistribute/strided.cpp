// Naive redistribution for _StridedShard (strided.h).
#include "redistribute/strided.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/redistribute/redistribute.h"
#include "dtensor/tensor/shard_layout.h"

namespace dtensor::detail {
namespace {

bool all_replicate(const Placements& placements) {
  return std::all_of(placements.begin(), placements.end(), [](const Placement& p) { return p.is_replicate(); });
}

// The coordinate of row-major index `index` on a mesh of `shape`.
std::vector<int64_t> unravel(int64_t index, const std::vector<int64_t>& shape) {
  std::vector<int64_t> coord(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    coord[k] = index % shape[k];
    index /= shape[k];
  }
  return coord;
}

at::Tensor box_of(const at::Tensor& full, const LocalShard& box) {
  at::Tensor out = full;
  for (int64_t d = 0; d < full.dim(); ++d) out = out.narrow(d, box.offset[d], box.shape[d]);
  return out;
}

}  // namespace

at::Tensor gather_full_value(const at::Tensor& local, const DTensorSpec& spec) {
  const DeviceMesh& mesh = spec.mesh;
  at::Tensor x = local.contiguous();
  // Partial -> Replicate = all-reduce, per Partial mesh dim.
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    if (spec.placements[i].is_partial()) x = all_reduce(x, spec.placements[i].reduce_op(), mesh, i);
  }
  const Placements placements = reduce_partials(spec.placements);
  if (all_replicate(placements)) return x;
  // Every rank's box, by row-major mesh index; the largest sets the padded row length.
  std::vector<LocalShard> boxes;
  int64_t row = 0;
  for (int64_t r = 0; r < mesh.size(); ++r) {
    boxes.push_back(local_shard(spec.meta.shape, mesh, placements, unravel(r, mesh.shape())));
    int64_t numel = 1;
    for (int64_t s : boxes.back().shape) numel *= s;
    row = std::max(row, numel);
  }
  at::Tensor stack = at::zeros({1, row}, x.options());
  stack[0].narrow(0, 0, x.numel()).copy_(x.reshape({-1}));
  // Innermost mesh dim first: after gathering dims k..ndim-1 the rows are indexed row-major by those dims'
  // coordinates, so at the end row r is mesh index r's shard.
  for (int64_t i = mesh.ndim() - 1; i >= 0; --i) {
    if (mesh.size(i) > 1) stack = all_gather(stack, 0, mesh, i, std::vector<int64_t>(mesh.size(i), stack.size(0)));
  }
  at::Tensor full = at::empty(spec.meta.shape, x.options());
  for (int64_t r = 0; r < mesh.size(); ++r) {
    const LocalShard& box = boxes[r];
    at::Tensor target = box_of(full, box);
    if (target.numel() > 0) target.copy_(stack[r].narrow(0, 0, target.numel()).view(box.shape));
  }
  return full;
}

at::Tensor redistribute_local_strided(const at::Tensor& local, const DTensorSpec& src, const Placements& dst) {
  if (src.placements == dst) return local;
  const at::Tensor full = gather_full_value(local, src);
  const auto coord = *src.mesh.get_coordinate();
  at::Tensor out = box_of(full, local_shard(src.meta.shape, src.mesh, dst, coord)).clone(at::MemoryFormat::Contiguous);
  // Replicate -> Partial: this rank's term (local, no communication).
  for (int64_t i = 0; i < src.mesh.ndim(); ++i) {
    if (dst[i].is_partial()) out = partition_value(out, dst[i].reduce_op(), coord[i], src.mesh.size(i));
  }
  return out;
}

}  // namespace dtensor::detail
