// View and shape ops (PyTorch's _view_ops.py, _tensor_ops.py): view / _unsafe_view / _reshape_alias (and
// through them reshape, flatten, unflatten), permute, transpose, t, unsqueeze, squeeze, expand, repeat. The
// ops that cut or index along a dim are in index_ops.cpp.
//
// When may a view keep a shard? Split the input and output shapes into groups of dims with equal products
// (dims of size 1 aside). A Shard of input dim d survives into the group's first output dim when d is the
// group's first input dim and, for a group that is not one-to-one, both that input dim and that output dim
// divide evenly by the ranks sharding it: then every rank's piece is one contiguous block of the group
// in both shapes. Otherwise the shard is gathered first (an all-gather on that mesh dim, as PyTorch's view
// rule does) and the view runs on the whole dim, unless the view splits or joins the sharded dim evenly with
// its neighbours (attention's [T, B, E] <-> [T, B*H, hd]): then the shard is kept as a _StridedShard, or a
// _StridedShard becomes a Shard again (strided_view_placement). Partial and Replicate pass through views.
// _reshape_alias (reshape's view path, which may carry non-contiguous strides) runs as view.
// view_as_complex needs the trailing (real, imag) dim whole; view_as_real adds it; other shards pass.
// repeat tiles dims: a shard of a dim repeated once survives (renumbered past the new leading dims); a
// repeated one is gathered first.
#include <ATen/ATen.h>

#include <numeric>

#include "dtensor/tensor/shard_layout.h"
#include "ops/strategy_utils.h"

namespace dtensor::ops {
namespace {

// Product of the mesh dims that shard tensor dim d.
int64_t shard_ways(const DTensorSpec& spec, int64_t d) {
  int64_t ways = 1;
  for (size_t i = 0; i < spec.placements.size(); ++i) {
    if (spec.placements[i].is_shard(d)) ways *= spec.mesh.size(static_cast<int64_t>(i));
  }
  return ways;
}

std::vector<int64_t> infer_size(std::vector<int64_t> size, int64_t numel) {
  int64_t known = 1, infer = -1;
  for (size_t k = 0; k < size.size(); ++k) {
    if (size[k] == -1) infer = static_cast<int64_t>(k);
    else known *= size[k];
  }
  if (infer >= 0) size[infer] = known == 0 ? 0 : numel / known;
  return size;
}

// The groups of a view: runs of input dims [in_begin, in_end) and output dims [out_begin, out_end) with equal
// products (dims of size 1 between groups belong to none).
struct ViewGroup {
  size_t in_begin, in_end, out_begin, out_end;
};

std::vector<ViewGroup> view_groups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<ViewGroup> groups;
  size_t i = 0, j = 0;
  while (i < in.size() && j < out.size()) {
    if (in[i] == 1) {
      ++i;
      continue;
    }
    if (out[j] == 1) {
      ++j;
      continue;
    }
    size_t gi = i, gj = j;
    int64_t pi = in[i++], pj = out[j++];
    while (pi != pj && pi != 0 && pj != 0) {
      if (pi < pj && i < in.size()) pi *= in[i++];
      else if (j < out.size()) pj *= out[j++];
      else break;
    }
    groups.push_back({gi, i, gj, j});
  }
  return groups;
}

// Maps each input dim to the output dim its shard would move to (-1: cannot keep a shard), per the group
// rule above. `one_to_one_dims` (when given) marks the input dims whose group is one dim in and one dim out:
// only there may a _StridedShard survive whole (strided_view_placement handles the others).
std::vector<int64_t> view_dim_map(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                  const DTensorSpec& spec, std::vector<bool>* one_to_one_dims = nullptr) {
  std::vector<int64_t> map(in.size(), -1);
  if (one_to_one_dims) one_to_one_dims->assign(in.size(), false);
  for (const ViewGroup& g : view_groups(in, out)) {
    const size_t gi = g.in_begin, gj = g.out_begin;
    bool one_to_one = (g.in_end - gi == 1) && (g.out_end - gj == 1);
    if (one_to_one_dims) (*one_to_one_dims)[gi] = one_to_one;
    // Only the group's first dim can keep its shard.
    const int64_t ways = shard_ways(spec, static_cast<int64_t>(gi));
    if (one_to_one || (in[gi] % ways == 0 && out[gj] % ways == 0)) map[gi] = static_cast<int64_t>(gj);
  }
  return map;
}

// The shards a view splits or joins with other dims (attention's heads: [T, B, E] <-> [T, B*H, hd] and
// [B*H, T, S] <-> [B, H, T, S]), kept without communication as PyTorch 2.14's view rule does.
// A shard of input dim d over n ranks, with split factor sf (1 for Shard), inside its group: the group's
// elements are `outer` = (product of the group's input dims before d) * sf blocks, each a run of `run` =
// in[d] / sf * (product of the group's input dims after d) elements, of which each rank holds the same 1/n.
// Output dim j of the group carries that as _StridedShard(j, outer / prefix) (Shard(j) when 1), where prefix is
// the product of the group's output dims before j, when each block is a whole number `per` of dim j's
// elements times the dims after j (per * suffix == run), and per and in[d] / sf split evenly over n.
// Only for a group no other mesh dim shards.
std::optional<Placement> strided_view_placement(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                                const DTensorSpec& spec, size_t mesh_dim) {
  const Placement& p = spec.placements[mesh_dim];
  const int64_t n = spec.mesh.size(static_cast<int64_t>(mesh_dim));
  const int64_t d = p.dim(), sf = p.split_factor();
  for (const ViewGroup& g : view_groups(in, out)) {
    if (static_cast<size_t>(d) < g.in_begin || static_cast<size_t>(d) >= g.in_end) continue;
    for (size_t i = 0; i < spec.placements.size(); ++i) {
      const Placement& q = spec.placements[i];
      if (i != mesh_dim && q.is_shard() && static_cast<size_t>(q.dim()) >= g.in_begin &&
          static_cast<size_t>(q.dim()) < g.in_end) {
        return std::nullopt;
      }
    }
    if (in[d] % sf != 0 || (in[d] / sf) % n != 0) return std::nullopt;
    int64_t outer = sf, run = in[d] / sf;
    for (size_t k = g.in_begin; k < static_cast<size_t>(d); ++k) outer *= in[k];
    for (size_t k = d + 1; k < g.in_end; ++k) run *= in[k];
    int64_t prefix = 1;
    for (size_t j = g.out_begin; j < g.out_end; prefix *= out[j], ++j) {
      if (outer % prefix != 0) break;
      const int64_t blocks = outer / prefix;
      if (out[j] % blocks != 0) continue;
      const int64_t per = out[j] / blocks;
      int64_t suffix = 1;
      for (size_t k = j + 1; k < g.out_end; ++k) suffix *= out[k];
      if (per * suffix != run || per % n != 0) continue;
      return blocks == 1 ? Shard(static_cast<int64_t>(j)) : _StridedShard(static_cast<int64_t>(j), blocks);
    }
    return std::nullopt;
  }
  return std::nullopt;
}

const TensorInput& self_of(const OpCall& call) { return call.tensors.at(0); }

std::vector<std::optional<Placements>> keep_inputs(const OpCall& call) {
  std::vector<std::optional<Placements>> in;
  for (const auto& t : call.tensors) in.push_back(t.spec ? std::optional<Placements>(t.spec->placements) : std::nullopt);
  return in;
}

// Output placements of a one-input view from a dim map (input dim -> output dim, -1: cannot keep it). A
// shard the view cannot keep is gathered first (Shard -> Replicate on that mesh dim = all-gather), as
// PyTorch's view rule does; the view then runs on the gathered dim. A kept shard keeps its split factor: a
// _StridedShard survives a renaming of dims (permute, transpose) whole; a view keeps one only where its
// group is one-to-one (`strided_ok`, when given).
ShardingDecision by_dim_map(const OpCall& call, const std::vector<int64_t>& map, size_t num_outputs,
                            const std::vector<bool>* strided_ok = nullptr) {
  const DTensorSpec& spec = *self_of(call).spec;
  Placements in = spec.placements, out = spec.placements;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].is_shard()) continue;
    const int64_t d = out[i].dim();
    const int64_t m = map[d];
    if (m < 0 || (out[i].is_strided_shard() && strided_ok && !(*strided_ok)[d])) {
      in[i] = Replicate();
      out[i] = Replicate();
    } else {
      out[i] = out[i].with_dim(m);
    }
  }
  std::vector<std::optional<Placements>> inputs = keep_inputs(call);
  inputs[0] = in;
  return make_decision(call, inputs, std::vector<Placements>(num_outputs, out));
}


// view / _unsafe_view(self, size): the size becomes local.
ShardingDecision view_strategy(const OpCall& call) {
  const at::Tensor& self = self_of(call).tensor;
  std::vector<int64_t> out = infer_size(call.arg(1).toIntVector(), self.numel());
  const DTensorSpec& spec = *self_of(call).spec;
  std::vector<bool> one_to_one;
  auto map = view_dim_map(self.sizes().vec(), out, spec, &one_to_one);
  ShardingDecision d = by_dim_map(call, map, 1, &one_to_one);
  // A shard the group rule would gather that a strided layout keeps (one mesh dim sharding that tensor dim).
  for (size_t i = 0; i < spec.placements.size(); ++i) {
    const Placement& p = spec.placements[i];
    if (!p.is_shard() || !d.outputs[0][i].is_replicate()) continue;
    if (auto kept = strided_view_placement(self.sizes().vec(), out, spec, i)) {
      (*d.inputs[0])[i] = p;
      d.outputs[0][i] = *kept;
    }
  }
  auto local = local_shape_of(out, *call.mesh, d.outputs[0]);
  d.local_int_lists.emplace_back(1, local);
  return d;
}

ShardingDecision permute_strategy(const OpCall& call) {
  auto dims = call.arg(1).toIntVector();
  int64_t n = self_of(call).tensor.dim();
  std::vector<int64_t> map(n, -1);
  for (size_t k = 0; k < dims.size(); ++k) map[normalize_dim(dims[k], n)] = static_cast<int64_t>(k);
  return by_dim_map(call, map, 1);
}

ShardingDecision transpose_strategy(const OpCall& call) {
  int64_t n = self_of(call).tensor.dim();
  std::vector<int64_t> map(std::max<int64_t>(n, 1));
  std::iota(map.begin(), map.end(), 0);
  if (n >= 2) {
    int64_t a = call.op.schema().arguments().size() > 1 ? normalize_dim(call.arg(1).toInt(), n) : 0;
    int64_t b = call.op.schema().arguments().size() > 2 ? normalize_dim(call.arg(2).toInt(), n) : 1;
    std::swap(map[a], map[b]);
  }
  return by_dim_map(call, map, 1);
}

ShardingDecision unsqueeze_strategy(const OpCall& call) {
  int64_t n = self_of(call).tensor.dim();
  int64_t d = call.arg(1).toInt();
  if (d < 0) d += n + 1;
  std::vector<int64_t> map(n);
  for (int64_t k = 0; k < n; ++k) map[k] = k < d ? k : k + 1;
  return by_dim_map(call, map, 1);
}

ShardingDecision squeeze_strategy(const OpCall& call) {
  const at::Tensor& self = self_of(call).tensor;
  int64_t n = self.dim();
  std::vector<bool> removed(n, false);
  if (call.num_args() == 1) {
    for (int64_t k = 0; k < n; ++k) removed[k] = self.size(k) == 1;
  } else if (call.arg(1).isInt()) {
    int64_t d = normalize_dim(call.arg(1).toInt(), n);
    if (n > 0) removed[d] = self.size(d) == 1;
  } else {
    for (int64_t d : call.arg(1).toIntVector()) {
      d = normalize_dim(d, n);
      removed[d] = self.size(d) == 1;
    }
  }
  // A removed dim has size 1: if it is sharded, one rank holds it and the others nothing, so it is
  // gathered first (a redistribution, not an error).
  const DTensorSpec& spec = *self_of(call).spec;
  Placements in = spec.placements, out = spec.placements;
  int64_t next = 0;
  std::vector<int64_t> map(n, -1);
  for (int64_t k = 0; k < n; ++k) map[k] = removed[k] ? -1 : next++;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].is_shard()) continue;
    if (map[in[i].dim()] < 0) {
      in[i] = out[i] = Replicate();
    } else {
      out[i] = in[i].with_dim(map[in[i].dim()]);
    }
  }
  return make_decision(call, {in}, {out});
}


ShardingDecision expand_strategy(const OpCall& call) {
  const at::Tensor& self = self_of(call).tensor;
  auto size = call.arg(1).toIntVector();
  int64_t lead = static_cast<int64_t>(size.size()) - self.dim();
  std::vector<int64_t> map(self.dim());
  for (int64_t k = 0; k < self.dim(); ++k) {
    int64_t target = size[k + lead];
    map[k] = (self.size(k) == 1 && target != 1 && target != -1) ? -1 : k + lead;
  }
  // A sharded size-1 dim being expanded must be replicated first (the expansion would repeat one rank's
  // element); that is a redistribution, not an error.
  const DTensorSpec& spec = *self_of(call).spec;
  Placements in = spec.placements, out = spec.placements;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].is_shard()) continue;
    int64_t m = map[in[i].dim()];
    if (m < 0) {
      in[i] = Replicate();
      out[i] = Replicate();
    } else {
      out[i] = in[i].with_dim(m);
    }
  }
  ShardingDecision d = make_decision(call, {in}, {out});
  // The local expand: sharded dims expand to their local size (-1 keeps a dim as it is).
  std::vector<int64_t> global = size;
  for (int64_t k = 0; k < static_cast<int64_t>(global.size()); ++k) {
    if (global[k] == -1) global[k] = self.size(k - lead);
  }
  auto local = local_shape_of(global, *call.mesh, out);
  d.local_int_lists.emplace_back(1, local);
  return d;
}


// _reshape_alias(self, size, stride) is reshape's view path; its strides describe the global layout. On
// the shards it is the same view of the local tensor: run it as view (which decides and cuts the size).
void reshape_alias_as_view(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  at::Tensor self = (*stack)[stack->size() - 3].toTensor();
  std::vector<int64_t> size = (*stack)[stack->size() - 2].toIntVector();
  torch::jit::drop(*stack, op.schema().arguments().size());
  stack->emplace_back(self.view(size));  // (below autograd: the DTensor kernel again)
}

ShardingDecision view_as_complex_strategy(const OpCall& call) {
  const int64_t last = self_of(call).tensor.dim() - 1;
  return needs_dim_whole(call, last, 1, [](int64_t k) { return k; });
}
ShardingDecision view_as_real_strategy(const OpCall& call) {
  return needs_dim_whole(call, -1, 1, [](int64_t k) { return k; });
}

// repeat(self, repeats): len(repeats) >= self.dim(); self's dims are the trailing ones of the output.
ShardingDecision repeat_strategy(const OpCall& call) {
  const at::Tensor& self = self_of(call).tensor;
  const auto repeats = call.arg(1).toIntVector();
  const int64_t lead = static_cast<int64_t>(repeats.size()) - self.dim();
  std::vector<int64_t> map(self.dim());
  for (int64_t k = 0; k < self.dim(); ++k) map[k] = repeats[k + lead] == 1 ? k + lead : -1;
  return by_dim_map(call, map, 1);  // tiling is linear: Partial and Replicate pass
}

const StrategyRegistration views({"aten::view", "aten::_unsafe_view"}, &view_strategy);
const StrategyRegistration repeats({"aten::repeat"}, &repeat_strategy);
const CustomHandlerRegistration reshape_alias_rule("aten::_reshape_alias", &reshape_alias_as_view);
const StrategyRegistration view_as_complex_rule({"aten::view_as_complex"}, &view_as_complex_strategy);
const StrategyRegistration view_as_real_rule({"aten::view_as_real"}, &view_as_real_strategy);
const StrategyRegistration permutes({"aten::permute"}, &permute_strategy);
const StrategyRegistration transposes({"aten::transpose.int", "aten::t", "aten::transpose_", "aten::t_"},
                                      &transpose_strategy);
const StrategyRegistration unsqueezes({"aten::unsqueeze", "aten::unsqueeze_"}, &unsqueeze_strategy);
const StrategyRegistration squeezes({"aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims"}, &squeeze_strategy);
const StrategyRegistration expands({"aten::expand"}, &expand_strategy);

}  // namespace
}  // namespace dtensor::ops
