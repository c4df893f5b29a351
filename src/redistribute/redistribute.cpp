// The redistribute planner and executor (PyTorch's _redistribute.py, planned our own way).
//
// Placement algebra, per mesh dim i of size n (group = the ranks along i):
//   Shard(d)  -> Replicate  all-gather along d
//   Partial   -> Replicate  all-reduce
//   Partial   -> Shard(d)   reduce-scatter along d
//   Shard(d)  -> Shard(e)   all-to-all (split e, concat d)
//   Replicate -> Shard(d)   local chunk, no communication
//   Replicate -> Partial    local split of the value (partition_value), no communication
//   Shard(d)  -> Partial    sum/avg: the shard placed into zeros of the full extent, no communication
//                           (avg scales by n); max/min: all-gather, then split
//
// Nesting: when mesh dims i < j both shard tensor dim d, j splits the piece i left (i is outer). Changing
// an outer shard of d therefore needs every inner shard of d undone first, and a new shard may only be
// cut once all outer ones are in place. Sizes along d at mesh dim i are torch.chunk pieces of the
// "region" the outer shards of d leave.
#include "dtensor/core/error.h"
#include "dtensor/redistribute/redistribute.h"

#include <ATen/ATen.h>

#include <unordered_map>
#include <stdexcept>

#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/tensor/shard_layout.h"
#include "redistribute/strided.h"

namespace dtensor {
namespace {

using Kind = TransformStep::Kind;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::ALL_GATHER: return "all_gather";
    case Kind::ALL_REDUCE: return "all_reduce";
    case Kind::REDUCE_SCATTER: return "reduce_scatter";
    case Kind::ALL_TO_ALL: return "all_to_all";
    case Kind::CHUNK: return "chunk";
    case Kind::PARTITION: return "partition";
    case Kind::PAD_PARTIAL: return "pad_partial";
  }
  return "?";
}

// Planning state: the current placements, and the queries the nesting rules need.
struct PlanState {
  Placements cur;
  const Placements& dst;

  int64_t n() const { return static_cast<int64_t>(cur.size()); }
  // Some mesh dim inside i currently shards tensor dim d.
  bool inner_shards(int64_t i, int64_t d) const {
    for (int64_t j = i + 1; j < n(); ++j) {
      if (cur[j].is_shard(d)) return true;
    }
    return false;
  }
  // Some mesh dim outside i still has to change how it shards tensor dim d.
  bool outer_changes(int64_t i, int64_t d) const {
    for (int64_t j = 0; j < i; ++j) {
      if (cur[j] != dst[j] && (cur[j].is_shard(d) || dst[j].is_shard(d))) return true;
    }
    return false;
  }
  // Mesh dim i may become Shard(d) now without breaking the nesting order.
  bool can_shard_now(int64_t i, int64_t d) const { return !inner_shards(i, d) && !outer_changes(i, d); }
};

std::string plan_key(const Placements& src, const Placements& dst) { return to_string(src) + "->" + to_string(dst); }

// Compact cache key: three bytes per placement (kind, dim, op).
std::string cache_key(const Placements& src, const Placements& dst) {
  std::string key;
  key.reserve(3 * (src.size() + dst.size()) + 1);
  auto put = [&](const Placements& ps) {
    for (const auto& p : ps) {
      key.push_back(static_cast<char>(p.kind()));
      key.push_back(static_cast<char>(p.is_shard() ? p.dim() : 0));
      key.push_back(static_cast<char>(p.is_partial() ? static_cast<int>(p.reduce_op()) : 0));
    }
  };
  put(src);
  key.push_back('|');
  put(dst);
  return key;
}

std::vector<TransformStep> make_plan(const Placements& src, const Placements& dst) {
  PlanState s{src, dst};
  std::vector<TransformStep> steps;
  auto emit = [&](Kind kind, int64_t i, Placement to) {
    steps.push_back(TransformStep{kind, i, s.cur[i], to});
    s.cur[i] = to;
  };
  const int64_t n = s.n();
  // 1. Free cuts first (Replicate -> Shard): every later collective moves less.
  for (int64_t i = 0; i < n; ++i) {
    if (s.cur[i].is_replicate() && s.dst[i].is_shard() && s.can_shard_now(i, s.dst[i].dim())) {
      emit(Kind::CHUNK, i, s.dst[i]);
    }
  }
  // 2. Reductions while the tensor is as sharded as it gets: reduce-scatter where the target is a shard
  //    that may be cut now, else all-reduce (and split again in step 4 if the target is another Partial).
  for (int64_t i = 0; i < n; ++i) {
    if (!s.cur[i].is_partial() || s.cur[i] == s.dst[i]) continue;
    if (s.dst[i].is_shard() && s.can_shard_now(i, s.dst[i].dim())) {
      emit(Kind::REDUCE_SCATTER, i, s.dst[i]);
    } else {
      emit(Kind::ALL_REDUCE, i, Replicate());
    }
  }
  // 3. Un-shard from the innermost mesh dim outwards; a shard moving to another tensor dim is one
  //    all-to-all when the nesting allows it.
  for (int64_t i = n - 1; i >= 0; --i) {
    if (!s.cur[i].is_shard()) continue;
    int64_t d = s.cur[i].dim();
    bool outer = s.outer_changes(i, d);
    if (s.cur[i] == s.dst[i] && !outer) continue;
    if (s.dst[i].is_shard() && s.dst[i] != s.cur[i] && !outer && s.can_shard_now(i, s.dst[i].dim())) {
      emit(Kind::ALL_TO_ALL, i, s.dst[i]);
    } else if (s.dst[i].is_partial() &&
               (s.dst[i].reduce_op() == ReduceOp::SUM || s.dst[i].reduce_op() == ReduceOp::AVG)) {
      // Padding needs no inner shard of d (none is left, going inwards out), whatever the outer dims do.
      emit(Kind::PAD_PARTIAL, i, s.dst[i]);
    } else {
      emit(Kind::ALL_GATHER, i, Replicate());
    }
  }
  // 4. What is left is Replicate: cut shards outer to inner, split Partials.
  for (int64_t i = 0; i < n; ++i) {
    if (s.cur[i] == s.dst[i]) continue;
    DTENSOR_CHECK(s.cur[i].is_replicate(), "dtensor: redistribute planner: unexpected ", plan_key(src, dst));
    emit(s.dst[i].is_shard() ? Kind::CHUNK : Kind::PARTITION, i, s.dst[i]);
  }
  return steps;
}

// Size along d of the region the shards of mesh dims before `mesh_dim` leave this rank (shard_layout.h).
int64_t region_of(const DTensorSpec& spec, const Placements& cur, int64_t mesh_dim, int64_t d,
                  const std::vector<int64_t>& coord) {
  return region_size(spec.meta.shape, spec.mesh, cur, mesh_dim, d, coord);
}

Placements normalized_dst(const DTensorSpec& src, const Placements& dst) {
  DTENSOR_CHECK(dst.size() == src.placements.size(), "dtensor: redistribute to ", dst.size(), " placements ",
                to_string(dst), " on a ", src.mesh.ndim(), "-D mesh");
  Placements out;
  for (const auto& p : dst) out.push_back(p.normalized(src.ndim()));
  return out;
}

}  // namespace

std::string TransformStep::to_string() const {
  return "mesh dim " + std::to_string(mesh_dim) + ": " + kind_name(kind) + " " + from.to_string() + " -> " +
         to.to_string();
}

std::vector<TransformStep> plan_redistribute(const DTensorSpec& src, const Placements& dst_in) {
  Placements dst = normalized_dst(src, dst_in);
  // Plans depend only on the placements: a per-thread cache (no lock on the hot path), bounded.
  thread_local std::unordered_map<std::string, std::vector<TransformStep>> cache;
  std::string key = cache_key(src.placements, dst);
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 1024) cache.clear();
    it = cache.emplace(std::move(key), make_plan(src.placements, dst)).first;
  }
  return it->second;
}

at::Tensor partition_value(const at::Tensor& value, ReduceOp op, int64_t mesh_coordinate, int64_t mesh_size) {
  (void)mesh_coordinate;
  switch (op) {
    case ReduceOp::SUM:
      // Every rank holds value / n (PyTorch's Partial._partition_value), so any rank's term is as good
      // as another's; the sum is the value up to rounding (exact when n is a power of two).
      return value / static_cast<double>(mesh_size);
    case ReduceOp::AVG:
    case ReduceOp::MAX:
    case ReduceOp::MIN:
      return value.clone();  // the mean / max / min of equal terms is the term
  }
  throw dtensor::Error("unreachable");
}

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& src, const Placements& dst) {
  // _StridedShard: not nested torch.chunk pieces; the naive path (redistribute/strided.h).
  if (has_strided_shard(src.placements) || has_strided_shard(dst)) {
    return detail::redistribute_local_strided(local, src, normalized_dst(src, dst));
  }
  auto steps = plan_redistribute(src, dst);
  if (steps.empty()) return local;
  auto coord = *src.mesh.get_coordinate();
  Placements cur = src.placements;
  at::Tensor x = local;
  for (const auto& step : steps) {
    const int64_t i = step.mesh_dim;
    ProcessGroup& group = src.mesh.get_group(i);
    const int64_t n = src.mesh.size(i);
    switch (step.kind) {
      case Kind::ALL_GATHER: {
        int64_t d = step.from.dim();
        x = all_gather(x, d, group, chunk_sizes(region_of(src, cur, i, d, coord), n));
        break;
      }
      case Kind::ALL_REDUCE:
        x = all_reduce(x, step.from.reduce_op(), group);
        break;
      case Kind::REDUCE_SCATTER: {
        int64_t d = step.to.dim();
        x = reduce_scatter(x, step.from.reduce_op(), d, group, chunk_sizes(region_of(src, cur, i, d, coord), n));
        break;
      }
      case Kind::ALL_TO_ALL: {
        int64_t d = step.from.dim(), e = step.to.dim();
        x = all_to_all(x, e, d, group, chunk_sizes(region_of(src, cur, i, d, coord), n),
                       chunk_sizes(region_of(src, cur, i, e, coord), n));
        break;
      }
      case Kind::CHUNK:
        x = narrow_chunk(x, step.to.dim(), chunk_sizes(x.size(step.to.dim()), n), coord[i]).clone(at::MemoryFormat::Contiguous);
        break;
      case Kind::PARTITION:
        x = partition_value(x, step.to.reduce_op(), coord[i], n);
        break;
      case Kind::PAD_PARTIAL: {
        // This rank's shard at its offset in zeros of the region: the terms sum to the region.
        int64_t d = step.from.dim();
        auto sizes = chunk_sizes(region_of(src, cur, i, d, coord), n);
        auto shape = x.sizes().vec();
        shape[d] = region_of(src, cur, i, d, coord);
        at::Tensor padded = at::zeros(shape, x.options());
        narrow_chunk(padded, d, sizes, coord[i]).copy_(x);
        x = step.to.reduce_op() == ReduceOp::AVG ? padded.mul_(n) : padded;
        break;
      }
    }
    cur[i] = step.to;
  }
  return x;
}

at::Tensor redistribute_local_naive(const at::Tensor& local, const DTensorSpec& src, const Placements& dst_in) {
  Placements dst = normalized_dst(src, dst_in);
  if (has_strided_shard(src.placements) || has_strided_shard(dst)) return detail::redistribute_local_strided(local, src, dst);
  auto coord = *src.mesh.get_coordinate();
  Placements cur = src.placements;
  at::Tensor full = local;
  // Materialise the full value: innermost mesh dim first, so each gather sees its region.
  for (int64_t i = src.mesh.ndim() - 1; i >= 0; --i) {
    ProcessGroup& group = src.mesh.get_group(i);
    if (cur[i].is_shard()) {
      int64_t d = cur[i].dim();
      full = all_gather(full, d, group, chunk_sizes(region_of(src, cur, i, d, coord), src.mesh.size(i)));
    } else if (cur[i].is_partial()) {
      full = all_reduce(full, cur[i].reduce_op(), group);
    }
    cur[i] = Replicate();
  }
  // Cut this rank's piece of the target out of it.
  LocalShard shard = local_shard(src.meta.shape, src.mesh, dst, coord);
  at::Tensor out = full;
  for (int64_t d = 0; d < full.dim(); ++d) out = out.narrow(d, shard.offset[d], shard.shape[d]);
  out = out.clone(at::MemoryFormat::Contiguous);
  for (int64_t i = 0; i < src.mesh.ndim(); ++i) {
    if (dst[i].is_partial()) out = partition_value(out, dst[i].reduce_op(), coord[i], src.mesh.size(i));
  }
  return out;
}

}  // namespace dtensor
