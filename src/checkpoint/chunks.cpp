#include "checkpoint/chunks.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dtensor/core/error.h"
#include "dtensor/api/dtensor_api.h"

namespace dtensor::checkpoint::detail {

int64_t Box::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string Box::to_string() const {
  std::string s = "[";
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (d > 0) s += ", ";
    s += std::to_string(offsets[d]) + ":" + std::to_string(offsets[d] + sizes[d]);
  }
  return s + "]";
}

std::optional<Box> intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.sizes.size(); ++d) {
    const int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    const int64_t hi = std::min(a.offsets[d] + a.sizes[d], b.offsets[d] + b.sizes[d]);
    if (hi <= lo) return std::nullopt;
    out.offsets.push_back(lo);
    out.sizes.push_back(hi - lo);
  }
  return out;
}

at::Tensor narrow_to(const at::Tensor& data, const Box& region, const Box& part) {
  at::Tensor v = data;
  for (size_t d = 0; d < part.sizes.size(); ++d) {
    v = v.narrow(static_cast<int64_t>(d), part.offsets[d] - region.offsets[d], part.sizes[d]);
  }
  return v;
}

namespace {

// Chunks are boxes: a _StridedShard layout must leave every rank (not just this one, so that all refuse alike,
// writers or not) one box.
void require_boxes(const DTensorSpec& spec) {
  if (!has_strided_shard(spec.placements)) return;
  for (int64_t r = 0; r < spec.mesh.size(); ++r) {
    std::vector<int64_t> c(spec.mesh.ndim());  // rank r's coordinate (row-major)
    for (int64_t i = spec.mesh.ndim() - 1, rest = r; i >= 0; rest /= spec.mesh.size(i), --i) {
      c[i] = rest % spec.mesh.size(i);
    }
    DTENSOR_CHECK(local_shard(spec.meta.shape, spec.mesh, spec.placements, c).box, "dtensor: checkpoint: a ",
                  to_string(spec.placements), " tensor on ", spec.mesh.to_string(),
                  " has shards that are not one box (a _StridedShard of uneven pieces); redistribute it first");
  }
}

}  // namespace

std::optional<Held> held(const at::Tensor& tensor) {
  if (!is_dtensor(tensor)) return Held{Box{std::vector<int64_t>(tensor.dim(), 0), tensor.sizes().vec()}, tensor};
  const DTensorSpec& spec = dtensor_spec(tensor);
  const auto coordinate = spec.mesh.get_coordinate();
  if (!coordinate) return std::nullopt;
  const LocalShard shard = local_shard(spec);
  require_boxes(spec);
  Held h{Box{shard.offset, shard.shape}, dtensor::detail::local_tensor(tensor)};
  for (size_t i = 0; i < spec.placements.size(); ++i) {
    const Placement& p = spec.placements[i];
    if (p.is_partial() && p.reduce_op() == ReduceOp::SUM && (*coordinate)[i] != 0) h.zero_on_load = true;
  }
  return h;
}

bool writes_chunk(const at::Tensor& tensor, size_t index, int world_rank, int world_size) {
  if (is_dtensor(tensor)) require_boxes(dtensor_spec(tensor));
  if (tensor.numel() == 0) return false;
  if (!is_dtensor(tensor)) return static_cast<int>(index % static_cast<size_t>(world_size)) == world_rank;
  const DTensorSpec& spec = dtensor_spec(tensor);
  const auto coordinate = spec.mesh.get_coordinate();
  if (!coordinate) return false;
  const LocalShard shard = local_shard(spec);
  if (std::find(shard.shape.begin(), shard.shape.end(), 0) != shard.shape.end()) return false;
  for (size_t i = 0; i < spec.placements.size(); ++i) {
    if (spec.placements[i].is_shard()) continue;  // distinct chunks along a Shard dim: each holder writes its own
    if ((*coordinate)[i] != static_cast<int64_t>(index % static_cast<size_t>(spec.mesh.size(static_cast<int64_t>(i))))) {
      return false;
    }
  }
  return true;
}

}  // namespace dtensor::checkpoint::detail
