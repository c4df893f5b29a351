#include "ops/strategy_utils.h"

#include "dtensor/tensor/shard_layout.h"
#include "dtensor/core/error.h"

#include <limits>
#include <stdexcept>

namespace dtensor::ops {

int64_t global_bytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

int64_t placement_cost(const Placement& from, const Placement& to, int64_t bytes, int64_t mesh_size) {
  if (from == to) return 0;
  if (from.is_replicate()) return to.is_shard() || to.is_partial() ? 0 : 1;  // local chunk / split
  if (from.is_shard() && to.is_replicate()) return bytes;                    // all-gather
  if (from.is_shard() && to.is_shard()) return bytes / std::max<int64_t>(mesh_size, 1) + 1;  // all-to-all
  if (from.is_partial() && to.is_shard()) return bytes;                      // reduce-scatter
  if (from.is_partial() && to.is_replicate()) return 2 * bytes;              // all-reduce
  return 3 * bytes;                                                          // via Replicate
}

ShardingDecision choose_per_mesh_dim(const OpCall& call, size_t num_outputs,
                                     const std::function<std::vector<DimCandidate>(int64_t mesh_dim)>& candidates_for) {
  const int64_t mesh_ndim = call.mesh->ndim();
  ShardingDecision d;
  d.inputs.assign(call.tensors.size(), std::nullopt);
  for (size_t k = 0; k < call.tensors.size(); ++k) {
    if (call.tensors[k].spec || !call.tensors[k].is_scalar()) d.inputs[k] = Placements(mesh_ndim, Replicate());
  }
  d.outputs.assign(num_outputs, Placements(mesh_ndim, Replicate()));
  for (int64_t i = 0; i < mesh_ndim; ++i) {
    auto candidates = candidates_for(i);
    if (candidates.empty()) call.fail("has no sharding strategy for mesh dim " + std::to_string(i));
    const DimCandidate* best = nullptr;
    int64_t best_cost = std::numeric_limits<int64_t>::max();
    for (const auto& c : candidates) {
      int64_t cost = 0;
      for (size_t k = 0; k < call.tensors.size(); ++k) {
        const TensorInput& in = call.tensors[k];
        if (!c.inputs[k]) continue;
        Placement from = in.spec ? in.spec->placements[i] : Replicate();
        cost += placement_cost(from, *c.inputs[k], global_bytes(in.tensor), call.mesh->size(i));
      }
      if (cost < best_cost) {
        best_cost = cost;
        best = &c;
      }
    }
    for (size_t k = 0; k < call.tensors.size(); ++k) {
      if (best->inputs[k] && d.inputs[k]) (*d.inputs[k])[i] = *best->inputs[k];
    }
    for (size_t o = 0; o < num_outputs; ++o) d.outputs[o][i] = best->outputs[o];
  }
  // 0-d plain tensors are replicated scalars: they are used as they are.
  for (size_t k = 0; k < call.tensors.size(); ++k) {
    if (call.tensors[k].is_scalar()) d.inputs[k] = std::nullopt;
  }
  return d;
}

ShardingDecision make_decision(const OpCall& call, std::vector<std::optional<Placements>> inputs,
                               std::vector<Placements> outputs) {
  ShardingDecision d;
  d.inputs = std::move(inputs);
  d.outputs = std::move(outputs);
  DTENSOR_CHECK(d.inputs.size() == call.tensors.size(), "make_decision: wrong input count");
  return d;
}

int64_t normalize_dim(int64_t dim, int64_t ndim) {
  int64_t n = std::max<int64_t>(ndim, 1);
  return dim < 0 ? dim + n : dim;
}

std::vector<int64_t> local_shape_of(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& p) {
  return local_shard(shape, mesh, p, *mesh.get_coordinate()).shape;
}

// Ops that need tensor dim `dim` of every tensor input whole; other shards are renumbered by `map_dim`.
ShardingDecision needs_dim_whole(const OpCall& call, int64_t dim, size_t num_outputs,
                                 const std::function<int64_t(int64_t)>& map_dim) {
  // Reference placements: the first DTensor input's, with the cut dim replicated.
  const DTensorSpec* ref = nullptr;
  for (const auto& t : call.tensors) {
    if (t.spec) {
      ref = t.spec;
      break;
    }
  }
  Placements in = ref->placements;
  for (auto& p : in) {
    if (p.is_shard(dim)) p = Replicate();
  }
  // Inputs of cat/stack with different placements all follow the reference; index tensors are replicated.
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    bool is_index = t.arg != call.tensors[0].arg;
    inputs.push_back(t.is_scalar() ? std::nullopt
                                   : std::optional<Placements>(is_index ? replicate_all(call.mesh->ndim()) : in));
  }
  Placements out = in;
  for (auto& p : out) {
    if (p.is_shard()) p = p.with_dim(map_dim(p.dim()));
  }
  return make_decision(call, inputs, std::vector<Placements>(num_outputs, out));
}

}  // namespace dtensor::ops
