// Ops that cut or index along a dim (PyTorch's _tensor_ops.py): slice, select, split, unbind, cat, stack,
// index_select, scatter, gather, masked_select / nonzero, and slice / select backward.
//
// They need that dim whole: a Shard of it becomes Replicate first (all-gather); other shards pass,
// renumbered (a _StridedShard with its split factor). Except where the cut follows a _StridedShard's own
// pieces (MultiheadAttention's packed [q | k | v]), which cost nothing:
//   _StridedShard(d, sf) split (chunk) into its sf equal pieces  -> each piece Shard(d), this rank's part of it
//   slice of pieces [j0, j1) of it                               -> _StridedShard(d, j1 - j0) (Shard(d) for one)
//   cat of k equal Shard(d) pieces on d (split's backward)       -> _StridedShard(d, k)
//   slice_backward of whole pieces (slice's backward)            -> _StridedShard(d, sf), zeros elsewhere
#include <ATen/ATen.h>

#include "dtensor/tensor/dtensor.h"
#include "ops/run_strategy.h"
#include "ops/strategy_utils.h"
#include "tensor/dtensor_impl.h"

namespace dtensor::ops {
namespace {
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
      out[i] = in[i].with_dim(select && k >= d ? k + 1 : k);
    }
  }
  ShardingDecision dec = make_decision(call, {in}, {out});
  dec.local_int_lists.emplace_back(1, local_shape_of(sizes, *call.mesh, out));
  return dec;
}
ShardingDecision slice_backward(const OpCall& call) { return cut_backward(call, false); }
ShardingDecision select_backward(const OpCall& call) { return cut_backward(call, true); }

ShardingDecision slice_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), call.tensors.at(0).tensor.dim());
  return needs_dim_whole(call, d, 1, [](int64_t k) { return k; });
}

ShardingDecision select_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), call.tensors.at(0).tensor.dim());
  return needs_dim_whole(call, d, 1, [d](int64_t k) { return k > d ? k - 1 : k; });
}

size_t num_returned(const OpCall& call) {
  // split / unbind return a list whose length the meta run knows; compute it the same way here.
  const at::Tensor& self = call.tensors.at(0).tensor;
  const std::string name = op_name(call.op);
  if (name == "aten::unbind.int") return self.size(normalize_dim(call.arg(1).toInt(), self.dim()));
  if (name == "aten::split_with_sizes") return call.arg(1).toIntVector().size();
  int64_t d = normalize_dim(call.arg(2).toInt(), self.dim());
  int64_t split = call.arg(1).toInt();
  int64_t size = self.size(d);
  return size == 0 ? 1 : static_cast<size_t>((size + split - 1) / split);
}

ShardingDecision split_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(2).toInt(), call.tensors.at(0).tensor.dim());
  return needs_dim_whole(call, d, num_returned(call), [](int64_t k) { return k; });
}

ShardingDecision unbind_strategy(const OpCall& call) {
  int64_t d = normalize_dim(call.arg(1).toInt(), call.tensors.at(0).tensor.dim());
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
  int64_t d = normalize_dim(call.arg(1).toInt(), call.tensors.at(0).tensor.dim());
  return needs_dim_whole(call, d, 1, [](int64_t k) { return k; });
}

// --- the cuts that follow a _StridedShard's pieces ------------------------------------------------------------

// The one mesh dim that shards tensor dim `d` of `spec` with a _StridedShard, or -1 (none, or more than one mesh
// dim sharding d).
int strided_mesh_dim(const DTensorSpec& spec, int64_t d) {
  int found = -1;
  for (size_t i = 0; i < spec.placements.size(); ++i) {
    if (!spec.placements[i].is_shard(d)) continue;
    if (found >= 0 || !spec.placements[i].is_strided_shard()) return -1;
    found = static_cast<int>(i);
  }
  return found;
}

// A DTensor of this rank's `local` piece with the parent's strides (a view) and the given shape and placements.
at::Tensor piece_of(const at::Tensor& local, const DTensorSpec& parent, std::vector<int64_t> shape, Placements placements) {
  return detail::make_dtensor(local, DTensorSpec(parent.mesh, std::move(placements),
                                                 TensorMeta{std::move(shape), parent.meta.stride, parent.meta.dtype}));
}

void split_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 3;
  const at::Tensor self = (*stack)[first].toTensor();
  if (is_dtensor(self)) {
    const DTensorSpec& spec = dtensor_spec(self);
    const int64_t d = normalize_dim((*stack)[first + 2].toInt(), self.dim());
    const int64_t split = (*stack)[first + 1].toInt();
    const int i = strided_mesh_dim(spec, d);
    if (i >= 0 && split * spec.placements[i].split_factor() == self.size(d)) {
      const int64_t sf = spec.placements[i].split_factor();
      at::AutoDispatchBelowADInplaceOrView below;  // the local pieces are plain tensors
      const at::Tensor local = detail::local_tensor(self);
      Placements out = spec.placements;
      out[i] = Shard(d);
      std::vector<int64_t> shape = self.sizes().vec();
      shape[d] = split;
      c10::List<at::Tensor> pieces;
      for (const at::Tensor& piece : local.split(local.size(d) / sf, d)) pieces.push_back(piece_of(piece, spec, shape, out));
      torch::jit::drop(*stack, 3);
      stack->emplace_back(std::move(pieces));
      return;
    }
  }
  run_strategy(op, stack, &split_strategy);
}

void slice_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 5;  // self, dim, start, end, step
  const at::Tensor self = (*stack)[first].toTensor();
  if (is_dtensor(self) && (*stack)[first + 4].toInt() == 1) {
    const DTensorSpec& spec = dtensor_spec(self);
    const int64_t d = normalize_dim((*stack)[first + 1].toInt(), self.dim());
    const int i = strided_mesh_dim(spec, d);
    const int64_t size = self.size(d);
    const int64_t sf = i >= 0 ? spec.placements[i].split_factor() : 1;
    auto clamp = [&](int64_t v) { return std::min(std::max<int64_t>(v < 0 ? v + size : v, 0), size); };
    const int64_t start = (*stack)[first + 2].isNone() ? 0 : clamp((*stack)[first + 2].toInt());
    const int64_t end = (*stack)[first + 3].isNone() ? size : clamp((*stack)[first + 3].toInt());
    if (i >= 0 && size % sf == 0 && start % (size / sf) == 0 && end % (size / sf) == 0 && end > start) {
      const int64_t j0 = start / (size / sf), j1 = end / (size / sf);
      at::AutoDispatchBelowADInplaceOrView below;  // the local piece is a plain tensor
      const at::Tensor local = detail::local_tensor(self);
      const int64_t piece = local.size(d) / sf;
      Placements out = spec.placements;
      out[i] = j1 - j0 == 1 ? Shard(d) : _StridedShard(d, j1 - j0);
      std::vector<int64_t> shape = self.sizes().vec();
      shape[d] = end - start;
      at::Tensor result = piece_of(local.narrow(d, j0 * piece, (j1 - j0) * piece), spec, shape, out);
      torch::jit::drop(*stack, 5);
      stack->emplace_back(std::move(result));
      return;
    }
  }
  run_strategy(op, stack, &slice_strategy);
}

void cat_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 2;
  const auto tensors = (*stack)[first].toTensorVector();
  if (tensors.size() >= 2 && is_dtensor(tensors[0])) {
    const DTensorSpec& spec = dtensor_spec(tensors[0]);
    const int64_t d = normalize_dim((*stack)[first + 1].toInt(), tensors[0].dim());
    int i = -1;
    for (size_t k = 0; k < spec.placements.size(); ++k) {
      if (spec.placements[k].is_shard(d)) i = (i == -1 && !spec.placements[k].is_strided_shard()) ? static_cast<int>(k) : -2;
    }
    bool same = i >= 0;
    for (const auto& t : tensors) {
      same = same && is_dtensor(t) && dtensor_spec(t).mesh == spec.mesh && dtensor_spec(t).placements == spec.placements &&
             t.sizes() == tensors[0].sizes() && t.scalar_type() == tensors[0].scalar_type();
    }
    if (same) {
      at::AutoDispatchBelowADInplaceOrView below;  // the local pieces are plain tensors
      std::vector<at::Tensor> locals;
      for (const auto& t : tensors) locals.push_back(detail::local_tensor(t));
      at::Tensor local = at::cat(locals, d);
      Placements out = spec.placements;
      out[i] = _StridedShard(d, static_cast<int64_t>(tensors.size()));
      std::vector<int64_t> shape = tensors[0].sizes().vec();
      shape[d] *= static_cast<int64_t>(tensors.size());
      at::Tensor result = detail::make_dtensor(
          local, DTensorSpec(spec.mesh, out, TensorMeta{shape, contiguous_strides(shape), spec.meta.dtype}));
      torch::jit::drop(*stack, 2);
      stack->emplace_back(std::move(result));
      return;
    }
  }
  run_strategy(op, stack, &cat_strategy);
}

// slice's backward of such a slice: zeros of the input's shape with the gradient in its pieces, laid out as the
// input was, _StridedShard(d, sf) (sf inferred: the slice is k = the gradient's split factor whole pieces).
void slice_backward_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const size_t first = stack->size() - 6;  // grad_output, input_sizes, dim, start, end, step
  const at::Tensor grad = (*stack)[first].toTensor();
  if (is_dtensor(grad) && (*stack)[first + 5].toInt() == 1) {
    const DTensorSpec& spec = dtensor_spec(grad);
    const std::vector<int64_t> sizes = (*stack)[first + 1].toIntVector();
    const int64_t d = normalize_dim((*stack)[first + 2].toInt(), static_cast<int64_t>(sizes.size()));
    int i = -1;
    for (size_t k = 0; k < spec.placements.size(); ++k) {
      if (spec.placements[k].is_shard(d)) i = i == -1 ? static_cast<int>(k) : -2;
    }
    const int64_t start = (*stack)[first + 3].toInt(), end = std::min((*stack)[first + 4].toInt(), sizes[d]);
    const int64_t k = i >= 0 ? spec.placements[i].split_factor() : 0;
    const int64_t piece = k > 0 && (end - start) % k == 0 ? (end - start) / k : 0;
    if (piece > 0 && start % piece == 0 && sizes[d] % piece == 0 && sizes[d] / piece > 1) {
      const int64_t sf = sizes[d] / piece;
      Placements out = spec.placements;
      out[i] = _StridedShard(d, sf);
      at::AutoDispatchBelowADInplaceOrView below;  // the local gradient is a plain tensor
      const at::Tensor local_grad = detail::local_tensor(grad);
      at::Tensor local = at::zeros(local_shape_of(sizes, spec.mesh, out), local_grad.options());
      const int64_t local_piece = local.size(d) / sf;
      local.narrow(d, start / piece * local_piece, k * local_piece).copy_(local_grad);
      at::Tensor result = detail::make_dtensor(
          local, DTensorSpec(spec.mesh, out, TensorMeta{sizes, contiguous_strides(sizes), spec.meta.dtype}));
      torch::jit::drop(*stack, 6);
      stack->emplace_back(std::move(result));
      return;
    }
  }
  run_strategy(op, stack, &slice_backward);
}

const CustomHandlerRegistration slices("aten::slice.Tensor", &slice_handler);
const StrategyRegistration selects({"aten::select.int"}, &select_strategy);
const CustomHandlerRegistration splits("aten::split.Tensor", &split_handler);
const StrategyRegistration split_with_sizes({"aten::split_with_sizes"}, &split_strategy);
const StrategyRegistration unbinds({"aten::unbind.int"}, &unbind_strategy);
const CustomHandlerRegistration cats("aten::cat", &cat_handler);
const StrategyRegistration stacks({"aten::stack"}, &stack_strategy);
const StrategyRegistration index_selects({"aten::index_select"}, &index_select_strategy);
// index_copy(self, dim, index, source) / index_copy_: source's slices written at self's `index` along dim (a
// paged KV cache's slots); index_fill (index_copy's backward for self) the same with a scalar. That dim whole in
// self and source; their other shards pass when they agree (a cache sharded by heads); the index replicated.
ShardingDecision index_copy_strategy(const OpCall& call) {
  const int64_t d = normalize_dim(call.arg(1).toInt(), call.tensors.at(0).tensor.dim());
  Placements p = call.tensors.at(0).spec ? call.tensors.at(0).spec->placements : call.tensors.back().spec->placements;
  for (auto& x : p) {
    if (x.is_shard(d) || x.is_partial()) x = Replicate();
  }
  std::vector<std::optional<Placements>> inputs;
  for (const auto& t : call.tensors) {
    inputs.push_back(t.is_scalar() ? std::nullopt
                                   : std::optional<Placements>(t.arg == 2 ? replicate_all(call.mesh->ndim()) : p));
  }
  return make_decision(call, inputs, {p});
}
const StrategyRegistration index_copies({"aten::index_copy", "aten::index_copy_", "aten::index_fill.int_Scalar",
                                         "aten::index_fill_.int_Scalar"},
                                        &index_copy_strategy);
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
const CustomHandlerRegistration slice_backwards("aten::slice_backward", &slice_backward_handler);
const StrategyRegistration select_backwards({"aten::select_backward"}, &select_backward);

}  // namespace
}  // namespace dtensor::ops
