// Matrix ops (PyTorch's _matrix_ops.py): mm, addmm, bmm, baddbmm. linear and matmul reach these through
// their decompositions (t / view / mm / addmm / bmm / _unsafe_view).
//
// Placement algebra per mesh dim for out[m, n] = A[m, k] @ B[k, n]:
//   A Shard(0),  B Replicate -> out Shard(0)     (rows of A)
//   A Replicate, B Shard(1)  -> out Shard(1)     (columns of B: Colwise)
//   A Shard(1),  B Shard(0)  -> out Partial(sum) (contraction split: Rowwise)
//   A Partial,   B Replicate -> out Partial      (linear in A), and symmetrically
//   A Replicate, B Replicate -> out Replicate
// addmm's bias follows the output (Partial output: the bias is split as Replicate -> Partial). bmm adds
// the batch dim: A Shard(0), B Shard(0) -> out Shard(0). A _StridedShard on a free dim is kept (below).
// The cheapest candidate wins per mesh dim.
#include <ATen/ATen.h>

#include "ops/strategy_utils.h"

namespace dtensor::ops {
namespace {

// Candidates for a (batched) matmul whose A / B / out have `batch` leading batch dims. `a`, `b`, `bias`
// index OpCall::tensors (bias may be -1).
std::vector<DimCandidate> matmul_candidates(const OpCall& call, int64_t i, int a, int b, int bias, int64_t batch) {
  const int64_t m = batch, n = batch + 1;  // out dims of rows and columns
  const size_t count = call.tensors.size();
  std::vector<DimCandidate> out;
  auto add = [&](Placement pa, Placement pb, Placement po) {
    DimCandidate c;
    c.inputs.assign(count, std::nullopt);
    c.inputs[a] = pa;
    c.inputs[b] = pb;
    if (bias >= 0) {
      const at::Tensor& t = call.tensors[bias].tensor;
      // The bias broadcasts against out's trailing dims.
      Placement pbias = Replicate();
      if (po.is_partial()) pbias = po;
      if (po.is_shard()) {
        int64_t k = po.dim() - (batch + 2 - t.dim());
        if (k >= 0 && t.size(k) != 1) pbias = po.with_dim(k);
      }
      c.inputs[bias] = pbias;
    }
    c.outputs = {po};
    return out.push_back(c);
  };
  const TensorInput& A = call.tensors[a];
  const TensorInput& B = call.tensors[b];
  auto partial_of = [&](const TensorInput& t) -> std::optional<Placement> {
    if (t.spec && t.spec->placements[i].is_partial()) {
      auto op = t.spec->placements[i].reduce_op();
      if (op == ReduceOp::SUM || op == ReduceOp::AVG) return t.spec->placements[i];
    }
    return std::nullopt;
  };
  // All-Replicate first, as PyTorch's gen_einsum_strategies lists it: when every input is Replicate, sharding the
  // output costs nothing too (a local chunk), and the first cheapest wins: the output stays Replicate, as PyTorch's
  // (a Shard(0) there made the next matmul against a Shard(0) weight all-gather it back).
  add(Replicate(), Replicate(), Replicate());
  add(Shard(m), Replicate(), Shard(m));
  add(Replicate(), Shard(n), Shard(n));
  add(Shard(n), Shard(m), Partial());
  if (auto p = partial_of(A)) add(*p, Replicate(), *p);
  if (auto p = partial_of(B)) add(Replicate(), *p, *p);
  for (int64_t d = 0; d < batch; ++d) add(Shard(d), Shard(d), Shard(d));
  // A _StridedShard (the per-head rows of MultiheadAttention's packed in_proj) is kept as it is on a free
  // dim: rows of A, columns of B, or a batch dim both share; on the contraction dim of both (same split
  // factor) the pieces still pair up, so the output is Partial.
  auto strided_of = [&](const TensorInput& t) -> std::optional<Placement> {
    if (t.spec && t.spec->placements[i].is_strided_shard()) return t.spec->placements[i];
    return std::nullopt;
  };
  const auto sa = strided_of(A), sb = strided_of(B);
  if (sa && sa->dim() == m) add(*sa, Replicate(), *sa);
  if (sb && sb->dim() == n) add(Replicate(), *sb, *sb);
  if (sa && sb && sa->dim() == n && sb->dim() == m && sa->split_factor() == sb->split_factor()) add(*sa, *sb, Partial());
  if (sa && sb && sa->dim() < batch && *sa == *sb) add(*sa, *sb, *sa);
  return out;
}

int find_arg(const OpCall& call, int arg) {
  for (size_t k = 0; k < call.tensors.size(); ++k) {
    if (call.tensors[k].arg == arg) return static_cast<int>(k);
  }
  call.fail("is missing tensor argument " + std::to_string(arg));
}

ShardingDecision mm_strategy(const OpCall& call) {
  int a = find_arg(call, 0), b = find_arg(call, 1);
  return choose_per_mesh_dim(call, 1, [&](int64_t i) { return matmul_candidates(call, i, a, b, -1, 0); });
}

ShardingDecision addmm_strategy(const OpCall& call) {
  int bias = find_arg(call, 0), a = find_arg(call, 1), b = find_arg(call, 2);
  return choose_per_mesh_dim(call, 1, [&](int64_t i) { return matmul_candidates(call, i, a, b, bias, 0); });
}

ShardingDecision bmm_strategy(const OpCall& call) {
  int a = find_arg(call, 0), b = find_arg(call, 1);
  return choose_per_mesh_dim(call, 1, [&](int64_t i) { return matmul_candidates(call, i, a, b, -1, 1); });
}

ShardingDecision baddbmm_strategy(const OpCall& call) {
  int bias = find_arg(call, 0), a = find_arg(call, 1), b = find_arg(call, 2);
  return choose_per_mesh_dim(call, 1, [&](int64_t i) { return matmul_candidates(call, i, a, b, bias, 1); });
}

const StrategyRegistration mm({"aten::mm"}, &mm_strategy);
const StrategyRegistration addmm({"aten::addmm"}, &addmm_strategy);
const StrategyRegistration bmm({"aten::bmm"}, &bmm_strategy);
const StrategyRegistration baddbmm({"aten::baddbmm"}, &baddbmm_strategy);

}  // namespace
}  // namespace dtensor::ops
