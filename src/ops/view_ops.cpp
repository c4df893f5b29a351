// View and shape ops (PyTorch's _view_ops.py, _tensor_ops.py): view / _unsafe_view / _reshape_alias (and
// through them reshape, flatten, unflatten), permute, transpose, t, unsqueeze, squeeze, expand, slice,
// select, split, unbind, cat, stack, index_select.
//
// When may a view keep a shard? Split the input and output shapes into groups of dims with equal products
// (dims of size 1 aside). A Shard of input dim d survives into the group's first output dim when d is the
// group's first input dim and, for a group that is not one-to-one, both that input dim and that output dim
// divide evenly by the ranks sharding it: then every rank's piece is one contiguous block of the group
// in both shapes. Otherwise the shard is gathered first (an all-gather on that mesh dim, as PyTorch's view
// rule does) and the view runs on the whole dim. Partial and Replicate pass through views unchanged.
// _reshape_alias (reshape's view path, which may carry non-contiguous strides) runs as view.
// view_as_complex needs the trailing (real, imag) dim whole; view_as_real adds it; other shards pass.
//
// Ops that index or cut along a dim (slice, select, split, unbind, cat, index_select) need that dim whole:
// a Shard of it becomes Replicate first (all-gather); other shards pass, renumbered.
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

// Maps each input dim to the output dim its shard would move to (-1: cannot keep a shard), per the group
// rule above.
std::vector<int64_t> view_dim_map(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                                  const DTensorSpec& spec) {
  std::vector<int64_t> map(in.size(), -1);
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
    bool one_to_one = (i - gi == 1) && (j - gj == 1);
    // Only the group's first dim can keep its shard.
    const int64_t ways = shard_ways(spec, static_cast<int64_t>(gi));
    if (one_to_one || (in[gi] % ways == 0 && out[gj] % ways == 0)) map[gi] = static_cast<int64_t>(gj);
  }
  return map;
}

const TensorInput& self_of(const OpCall& call) { return call.tensors.at(0); }

std::vector<std::optional<Placements>> keep_inputs(const OpCall& call) {
  std::vector<std::optional<Placements>> in;
  for (const auto& t : call.tensors) in.push_back(t.spec ? std::optional<Placements>(t.spec->placements) : std::nullopt);
  return in;
}

// Output placements of a one-input view from a dim map (input dim -> output dim, -1: cannot keep it). A
// shard the view cannot keep is gathered first (Shard -> Replicate on that mesh dim = all-gather), as
// PyTorch's view rule does; the view then runs on the gathered dim.
ShardingDecision by_dim_map(const OpCall& call, const std::vector<int64_t>& map, size_t num_outputs) {
  const DTensorSpec& spec = *self_of(call).spec;
  Placements in = spec.placements, out = spec.placements;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!out[i].is_shard()) continue;
    const int64_t m = map[out[i].dim()];
    if (m < 0) {
      in[i] = Replicate();
      out[i] = Replicate();
    } else {
      out[i] = Shard(m);
    }
  }
  std::vector<std::optional<Placements>> inputs = keep_inputs(call);
  inputs[0] = in;
  return make_decision(call, inputs, std::vector<Placements>(num_outputs, out));
}

// This rank's shape of a tensor of global `shape` under `placements`.
std::vector<int64_t> local_shape_of(const std::vector<int64_t>& shape, const DeviceMesh& mesh, const Placements& p) {
  return local_shard(shape, mesh, p, *mesh.get_coordinate()).shape;
}

// view / _unsafe_view(self, size): the size becomes local.
ShardingDecision view_strategy(const OpCall& call) {
  const at::Tensor& self = self_of(call).tensor;
  std::vector<int64_t> out = infer_size(call.arg(1).toIntVector(), self.numel());
  auto map = view_dim_map(self.sizes().vec(), out, *self_of(call).spec);
  ShardingDecision d = by_dim_map(call, map, 1);
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
      out[i] = Shard(map[in[i].dim()]);
    }
  }
  return make_decision(call, {in}, {out});
}

// slice_backward(grad_output, input_sizes, dim, start, end, step) and select_backward(grad_output,
// input_sizes, dim, index): zeros of the input's shape with the grad written into the cut. The cut dim
// must be whole; input_sizes is global and becomes this rank's.
ShardingDecision cut_backward(const OpCall& call, bool select) {
  const TensorInput& grad = call.tensors.at(0);
  auto sizes = call.arg(1).toIntVector();
  int64_t d = normalize_dim(call.arg(2).toInt(), static_cast<int64_t>(sizes.size()));
  Placements in = grad.spec->placements, out = grad.spec->placements;
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].is_shard()) continue;
    int64_t k = in[i].dim();
    if (!select && k == d) {
      in[i] = out[i] = Replicate();
    } else {
      out[i] = Shard(select && k >= d ? k + 1 : k);
    }
  }
  ShardingDecision dec = make_decision(call, {in}, {out});
  dec.local_int_lists.emplace_back(1, local_shape_of(sizes, *call.mesh, out));
  return dec;
}
ShardingDecision slice_backward(const OpCall& call) { return cut_backward(call, false); }
ShardingDecision select_backward(const OpCall& call) { return cut_backward(call, true); }

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
      out[i] = Shard(m);
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
    if (p.is_shard()) p = Shard(map_dim(p.dim()));
  }
  return make_decision(call, inputs, std::vector<Placements>(num_outputs, out));
}

ShardingDecision slice_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), self_of(call).tensor.dim());
  return needs_dim_whole(call, d, 1, [](int64_t k) { return k; });
}

ShardingDecision select_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), self_of(call).tensor.dim());
  return needs_dim_whole(call, d, 1, [d](int64_t k) { return k > d ? k - 1 : k; });
}

size_t num_returned(const OpCall& call) {
  // split / unbind return a list whose length the meta run knows; compute it the same way here.
  const at::Tensor& self = self_of(call).tensor;
  const std::string name = op_name(call.op);
  if (name == "aten::unbind.int") return self.size(normalize_dim(call.arg(1).toInt(), self.dim()));
  if (name == "aten::split_with_sizes") return call.arg(1).toIntVector().size();
  int64_t d = normalize_dim(call.arg(2).toInt(), self.dim());
  int64_t split = call.arg(1).toInt();
  int64_t size = self.size(d);
  return size == 0 ? 1 : static_cast<size_t>((size + split - 1) / split);
}

ShardingDecision split_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(2).toInt(), self_of(call).tensor.dim());
  return needs_dim_whole(call, d, num_returned(call), [](int64_t k) { return k; });
}

ShardingDecision unbind_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), self_of(call).tensor.dim());
  return needs_dim_whole(call, d, num_returned(call), [d](int64_t k) { return k > d ? k - 1 : k; });
}

ShardingDecision cat_strategy(const OpCall& call) {
  int64_t ndim = 0;
  for (const auto& t : call.tensors) ndim = std::max<int64_t>(ndim, t.tensor.dim());
  int64_t d = normalize_dim(call.arg(1).toInt(), ndim);
  return needs_dim_whole(call, d, 1, [](int64_t k) { return k; });
}

ShardingDecision stack_strategy(const OpCall& call) {
  int64_t ndim = call.tensors[0].tensor.dim();
  int64_t d = call.arg(1).toInt();
  if (d < 0) d += ndim + 1;
  return needs_dim_whole(call, -1, 1, [d](int64_t k) { return k >= d ? k + 1 : k; });
}

ShardingDecision index_select_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), self_of(call).tensor.dim());
  return needs_dim_whole(call, d, 1, [](int64_t k) { return k; });
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

const StrategyRegistration views({"aten::view", "aten::_unsafe_view"}, &view_strategy);
const CustomHandlerRegistration reshape_alias_rule("aten::_reshape_alias", &reshape_alias_as_view);
const StrategyRegistration view_as_complex_rule({"aten::view_as_complex"}, &view_as_complex_strategy);
const StrategyRegistration view_as_real_rule({"aten::view_as_real"}, &view_as_real_strategy);
const StrategyRegistration permutes({"aten::permute"}, &permute_strategy);
const StrategyRegistration transposes({"aten::transpose.int", "aten::t", "aten::transpose_", "aten::t_"},
                                      &transpose_strategy);
const StrategyRegistration unsqueezes({"aten::unsqueeze", "aten::unsqueeze_"}, &unsqueeze_strategy);
const StrategyRegistration squeezes({"aten::squeeze", "aten::squeeze.dim", "aten::squeeze.dims"}, &squeeze_strategy);
const StrategyRegistration expands({"aten::expand"}, &expand_strategy);
const StrategyRegistration slices({"aten::slice.Tensor"}, &slice_strategy);
const StrategyRegistration selects({"aten::select.int"}, &select_strategy);
const StrategyRegistration splits({"aten::split.Tensor", "aten::split_with_sizes"}, &split_strategy);
const StrategyRegistration unbinds({"aten::unbind.int"}, &unbind_strategy);
const StrategyRegistration cats({"aten::cat"}, &cat_strategy);
const StrategyRegistration stacks({"aten::stack"}, &stack_strategy);
const StrategyRegistration index_selects({"aten::index_select"}, &index_select_strategy);
// scatter(self, dim, index, src) / scatter_ and scatter_add: the scatter dim whole everywhere; other
// shards follow the index (max.dim's backward scatters into plain zeros: see autograd_zeros).
ShardingDecision scatter_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), call.tensors.at(0).tensor.dim());
  const TensorInput* ref = nullptr;
  for (const auto& t : call.tensors) {
    if (t.spec && !ref) ref = &t;
  }
  Placements p = reduce_partials(ref->spec->placements);
  for (auto& x : p) {
    if (x.is_shard(d)) x = Replicate();
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) inputs.push_back(t.is_scalar() ? std::nullopt : std::optional<Placements>(p));
  return make_decision(call, inputs, {p});
}
const StrategyRegistration scatters({"aten::scatter.src", "aten::scatter_.src", "aten::scatter_add", "aten::scatter_add_"},
                                    &scatter_strategy);
// Ops whose output shape depends on the data (masked_select, nonzero): computed on replicated inputs, the
// output replicated. The global shape is learnt from the local result (no meta kernel can know it).
ShardingDecision replicated_only(const OpCall& call) {
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    inputs.push_back(t.is_scalar() ? std::nullopt : std::optional<Placements>(replicate_all(call.mesh->ndim())));
  }
  return make_decision(call, inputs, {replicate_all(call.mesh->ndim())});
}
// gather(self, dim, index): the gather dim whole; a shard of another dim survives where index and self
// have the same size there (their pieces then line up), else it is gathered too.
ShardingDecision gather_strategy(const OpCall& call) {
  const TensorInput& self = call.tensors.at(0);
  const TensorInput& index = call.tensors.at(1);
  int64_t d = normalize_dim(call.arg(1).toInt(), self.tensor.dim());
  Placements p = reduce_partials(self.spec ? self.spec->placements : replicate_all(call.mesh->ndim()));
  for (auto& x : p) {
    if (x.is_shard() && (x.dim() == d || index.tensor.size(x.dim()) != self.tensor.size(x.dim()))) x = Replicate();
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) inputs.push_back(t.is_scalar() ? std::nullopt : std::optional<Placements>(p));
  return make_decision(call, inputs, {p});
}
const StrategyRegistration gathers({"aten::gather"}, &gather_strategy);
const StrategyRegistration data_dependent({"aten::masked_select", "aten::nonzero"}, &replicated_only);
const StrategyRegistration slice_backwards({"aten::slice_backward"}, &slice_backward);
const StrategyRegistration select_backwards({"aten::select_backward"}, &select_backward);

}  // namespace
}  // namespace dtensor::ops
