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

std::vector<int64_t> shape_of(const std::vector<Runs>& runs) {
  std::vector<int64_t> shape;
  for (const Runs& r : runs) shape.push_back(run_length(r));
  return shape;
}

int64_t numel_of(const std::vector<Runs>& runs) {
  int64_t n = 1;
  for (const Runs& r : runs) n *= run_length(r);
  return n;
}

// The shard of `full` whose runs are `runs`, in local order (a copy).
at::Tensor shard_of(const at::Tensor& full, const std::vector<Runs>& runs) {
  at::Tensor out = full;
  for (int64_t d = 0; d < full.dim(); ++d) out = select_runs(out, d, runs[d]);
  return out.clone(at::MemoryFormat::Contiguous);
}

// Writes `values` (a shard in local order) to the places `runs` name in `full`, one block per combination
// of runs from dim `d` on.
void place_runs(const at::Tensor& full, const std::vector<Runs>& runs, const at::Tensor& values, int64_t d = 0) {
  if (values.numel() == 0) return;
  if (d == full.dim()) {
    full.copy_(values);
    return;
  }
  int64_t at = 0;
  for (const Run& r : runs[d]) {
    place_runs(full.narrow(d, r.start, r.length), runs, values.narrow(d, at, r.length), d + 1);
    at += r.length;
  }
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
  // The shards of the ranks that differ from this one only along Shard mesh dims (along a Replicate dim each
  // rank keeps its own copy, as PyTorch does: replicas need not agree, e.g. upstream gradients), row-major by
  // those dims' coordinates; the largest sets the padded row length.
  const auto own = *mesh.get_coordinate();
  std::vector<int64_t> sharded;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    if (placements[i].is_shard() && mesh.size(i) > 1) sharded.push_back(i);
  }
  int64_t count = 1;
  for (int64_t i : sharded) count *= mesh.size(i);
  std::vector<std::vector<Runs>> shards;
  int64_t row = 0;
  for (int64_t r = 0; r < count; ++r) {
    std::vector<int64_t> coord = own;
    int64_t rest = r;
    for (size_t k = sharded.size(); k-- > 0;) {
      coord[sharded[k]] = rest % mesh.size(sharded[k]);
      rest /= mesh.size(sharded[k]);
    }
    shards.push_back(shard_runs(spec.meta.shape, mesh, placements, coord));
    row = std::max(row, numel_of(shards.back()));
  }
  at::Tensor stack = at::zeros({1, row}, x.options());
  stack[0].narrow(0, 0, x.numel()).copy_(x.reshape({-1}));
  // Innermost Shard mesh dim first: after gathering dims k.. the rows are indexed row-major by their
  // coordinates, so at the end row r is shards[r].
  for (size_t k = sharded.size(); k-- > 0;) {
    const int64_t i = sharded[k];
    stack = all_gather(stack, 0, mesh, i, std::vector<int64_t>(mesh.size(i), stack.size(0)));
  }
  at::Tensor full = at::empty(spec.meta.shape, x.options());
  for (size_t r = 0; r < shards.size(); ++r) {
    place_runs(full, shards[r], stack[r].narrow(0, 0, numel_of(shards[r])).view(shape_of(shards[r])));
  }
  return full;
}

at::Tensor redistribute_local_strided(const at::Tensor& local, const DTensorSpec& src, const Placements& dst) {
  if (src.placements == dst) return local;
  const at::Tensor full = gather_full_value(local, src);
  const auto coord = *src.mesh.get_coordinate();
  at::Tensor out = shard_of(full, shard_runs(src.meta.shape, src.mesh, dst, coord));
  // Replicate -> Partial: this rank's term (local, no communication).
  for (int64_t i = 0; i < src.mesh.ndim(); ++i) {
    if (dst[i].is_partial()) out = partition_value(out, dst[i].reduce_op(), coord[i], src.mesh.size(i));
  }
  return out;
}

}  // namespace dtensor::detail
