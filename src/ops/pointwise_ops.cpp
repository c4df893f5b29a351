// Pointwise ops (PyTorch's _pointwise_ops.py): unary, binary and ternary with broadcasting and type
// promotion, functional, in-place and out=.
//
// Placement algebra per mesh dim. Candidates for the output: Shard(d) of any input (mapped through
// broadcasting: an input that broadcasts dim d, or lacks it, must be Replicate there), Replicate, and Partial
// where the op is linear in its Partial inputs:
//   linear unary (neg, clone, mul/div by a Scalar, dtype casts)  P(sum|avg) -> P(sum|avg)
//   additive (add, sub)                   some input P(op), the others P(op) or split into terms
//                                         (Replicate -> Partial, local), no scalar tensors -> P(op)
//   multiplicative (mul; div numerator)   exactly one P(sum|avg) input, the others Replicate -> P
//   shift by a Scalar (add/sub.Scalar)    P(avg|max|min) -> kept (a shift of every term shifts the
//                                         mean / max / min); P(sum) is reduced first (n shifts)
//   masked_fill(mask, 0)                  P(sum|avg) self, Replicate mask -> kept (zeroing every term)
//   everything else                       Partial inputs are reduced first (all-reduce)
// The cheapest candidate (bytes moved) wins; in-place ops keep self's placements. A _StridedShard input
// gives a _StridedShard candidate (same-shape operands share its geometry: FSDP's sharded optimizer state).
#include <ATen/ATen.h>

#include "ops/strategy_utils.h"

namespace dtensor::ops {
namespace {

enum class Linearity { NONE, UNARY, ADDITIVE, MULTIPLICATIVE, DIVISION, SHIFT, MASK_ZERO };

bool linear_partial(const Placement& p) {
  return p.is_partial() && (p.reduce_op() == ReduceOp::SUM || p.reduce_op() == ReduceOp::AVG);
}

// Output dim `d` of an output of `out_ndim` dims, seen from input `in`: its own dim, or -1 where the input
// broadcasts (lacks the dim or has size 1 where the output does not).
int64_t input_dim_for(const TensorInput& in, int64_t d, int64_t out_ndim, const std::vector<int64_t>& out_shape) {
  int64_t k = d - (out_ndim - in.tensor.dim());
  if (k < 0) return -1;
  if (in.tensor.size(k) == 1 && out_shape[d] != 1) return -1;
  return k;
}

ShardingDecision pointwise(const OpCall& call, Linearity linearity) {
  // Output shape: broadcast of the tensor inputs' shapes.
  std::vector<int64_t> out_shape;
  for (const auto& in : call.tensors) {
    auto s = in.tensor.sizes();
    if (static_cast<int64_t>(s.size()) > static_cast<int64_t>(out_shape.size())) {
      out_shape.insert(out_shape.begin(), s.size() - out_shape.size(), 1);
    }
    for (size_t k = 0; k < s.size(); ++k) {
      int64_t& o = out_shape[out_shape.size() - s.size() + k];
      if (o == 1) o = s[k];
    }
  }
  const int64_t out_ndim = static_cast<int64_t>(out_shape.size());
  const auto& schema = call.op.schema();
  const bool in_place = !schema.arguments().empty() && schema.arguments()[0].alias_info() &&
                        schema.arguments()[0].alias_info()->isWrite();
  // out= ops: the written argument is an output, not an input to map.
  auto is_out_arg = [&](const TensorInput& in) {
    const auto& a = schema.arguments()[in.arg];
    return in.arg > 0 && a.alias_info() && a.alias_info()->isWrite();
  };
  bool has_scalar_tensor = false;
  for (const auto& in : call.tensors) has_scalar_tensor = has_scalar_tensor || in.is_scalar();
  const size_t num_outputs = schema.returns().size();

  return choose_per_mesh_dim(call, num_outputs, [&](int64_t i) {
    std::vector<DimCandidate> out;
    auto candidate = [&](const Placement& out_p) {
      DimCandidate c;
      for (const auto& in : call.tensors) {
        if (in.is_scalar()) {
          c.inputs.push_back(std::nullopt);
        } else if (is_out_arg(in)) {
          c.inputs.push_back(out_p);
        } else if (out_p.is_shard()) {
          int64_t k = input_dim_for(in, out_p.dim(), out_ndim, out_shape);
          c.inputs.push_back(k < 0 ? Replicate() : out_p.with_dim(k));  // a _StridedShard stays one
        } else if (out_p.is_partial() && in.spec && in.spec->placements[i].is_partial()) {
          c.inputs.push_back(in.spec->placements[i]);  // a Partial term stays one
        } else if (out_p.is_partial() && linearity == Linearity::ADDITIVE) {
          c.inputs.push_back(out_p);  // a summand is split into terms (Replicate -> Partial, local)
        } else {
          c.inputs.push_back(Replicate());  // Replicate output; or the non-Partial factors of a Partial product
        }
      }
      c.outputs.assign(num_outputs, out_p);
      return c;
    };
    // Partial candidate, where the op keeps it.
    std::optional<Placement> partial;
    std::vector<const TensorInput*> dts;
    for (const auto& in : call.tensors) {
      if (in.spec && !is_out_arg(in)) dts.push_back(&in);
    }
    int partial_count = 0;
    for (auto* in : dts) partial_count += linear_partial(in->spec->placements[i]) ? 1 : 0;
    if (linearity == Linearity::SHIFT && dts.size() == 1 && dts[0]->spec->placements[i].is_partial() &&
        dts[0]->spec->placements[i].reduce_op() != ReduceOp::SUM) {
      partial = dts[0]->spec->placements[i];
    }
    if (linearity == Linearity::MASK_ZERO && partial_count == 1 && dts[0]->arg == 0 &&
        linear_partial(dts[0]->spec->placements[i]) && call.arg(2).isScalar() && call.arg(2).toScalar().toDouble() == 0.0) {
      partial = dts[0]->spec->placements[i];
    }
    if (partial_count > 0 && !partial) {
      Placement p = [&] {
        for (auto* in : dts) {
          if (linear_partial(in->spec->placements[i])) return in->spec->placements[i];
        }
        return Replicate();
      }();
      bool same_op = true;
      for (auto* in : dts) same_op = same_op && (!in->spec->placements[i].is_partial() || in->spec->placements[i] == p);
      switch (linearity) {
        case Linearity::UNARY:
          if (dts.size() == 1) partial = p;
          break;
        case Linearity::ADDITIVE:
          // Partial(op) + Partial(op) is a term of the sum; a Replicate (or Shard) summand can be split
          // into terms locally. A plain scalar tensor cannot (it would be added once per rank).
          if (same_op && !has_scalar_tensor) partial = p;
          break;
        case Linearity::MULTIPLICATIVE:
          if (partial_count == 1) partial = p;
          break;
        case Linearity::DIVISION:
          if (partial_count == 1 && dts[0]->arg == 0 && linear_partial(dts[0]->spec->placements[i])) partial = p;
          break;
        case Linearity::NONE:
        case Linearity::SHIFT:
        case Linearity::MASK_ZERO:
          break;
      }
    }
    if (in_place) {
      // self decides; it cannot move.
      const TensorInput& self = call.tensors[0];
      Placement sp = self.spec ? self.spec->placements[i] : Replicate();
      if (sp.is_partial() && !(partial && *partial == sp)) {
        call.fail("cannot keep its in-place output " + sp.to_string() +
                  " (the op is not linear in it); redistribute self first");
      }
      if (sp.is_partial()) {
        // The other Partial inputs stay as they are; Replicate ones stay Replicate.
        DimCandidate c = candidate(sp);
        out.push_back(c);
      } else {
        out.push_back(candidate(sp));
      }
      return out;
    }
    if (partial) out.push_back(candidate(*partial));
    for (auto* in : dts) {
      const Placement& p = in->spec->placements[i];
      if (!p.is_shard()) continue;
      int64_t d = p.dim() + (out_ndim - in->tensor.dim());
      if (input_dim_for(*in, d, out_ndim, out_shape) < 0) continue;
      out.push_back(candidate(p.with_dim(d)));
    }
    out.push_back(candidate(Replicate()));
    return out;
  });
}

ShardingDecision pointwise_nonlinear(const OpCall& call) { return pointwise(call, Linearity::NONE); }
ShardingDecision pointwise_unary_linear(const OpCall& call) { return pointwise(call, Linearity::UNARY); }
ShardingDecision pointwise_additive(const OpCall& call) { return pointwise(call, Linearity::ADDITIVE); }
ShardingDecision pointwise_multiplicative(const OpCall& call) { return pointwise(call, Linearity::MULTIPLICATIVE); }
ShardingDecision pointwise_division(const OpCall& call) { return pointwise(call, Linearity::DIVISION); }
ShardingDecision pointwise_shift(const OpCall& call) { return pointwise(call, Linearity::SHIFT); }
ShardingDecision pointwise_mask_zero(const OpCall& call) { return pointwise(call, Linearity::MASK_ZERO); }

// Functional, in-place and out= overloads of each name.
std::vector<std::string> overloads(const std::vector<std::string>& bases) {
  std::vector<std::string> names;
  for (const auto& b : bases) names.push_back("aten::" + b);
  return names;
}

const StrategyRegistration unary_linear(overloads({"neg", "neg_", "neg.out", "mul.Scalar", "mul_.Scalar",
                                                   "div.Scalar", "div_.Scalar", "positive", "conj_physical",
                                                   "_conj", "resolve_conj", "_conj_physical"}),
                                        &pointwise_unary_linear);
const StrategyRegistration additive(overloads({"add.Tensor", "add_.Tensor", "add.out", "sub.Tensor", "sub_.Tensor",
                                               "sub.out"}),
                                    &pointwise_additive);
const StrategyRegistration multiplicative(overloads({"mul.Tensor", "mul_.Tensor", "mul.out"}), &pointwise_multiplicative);
const StrategyRegistration shift(overloads({"add.Scalar", "add_.Scalar", "sub.Scalar", "sub_.Scalar"}), &pointwise_shift);
const StrategyRegistration mask_zero(overloads({"masked_fill.Scalar", "masked_fill_.Scalar"}), &pointwise_mask_zero);
const StrategyRegistration division(overloads({"div.Tensor", "div_.Tensor", "div.out"}), &pointwise_division);
const StrategyRegistration nonlinear(
    overloads({
        // unary math
        "abs", "abs_", "exp", "exp_", "log", "log_", "log1p", "sqrt", "sqrt_", "rsqrt", "rsqrt_", "sin", "cos",
        "reciprocal", "reciprocal_", "sign", "floor", "ceil", "round", "square", "erf", "exp2", "expm1",
        "pow.Tensor_Scalar", "pow_.Scalar", "pow.Tensor_Tensor", "pow.Scalar", "polar", "complex", "real", "imag",
        // activations and their backwards
        "relu", "relu_", "silu", "silu_", "gelu", "gelu_", "sigmoid", "sigmoid_", "tanh", "tanh_", "threshold_backward",
        "silu_backward", "gelu_backward", "sigmoid_backward", "tanh_backward", "hardtanh", "leaky_relu",
        // binary and ternary
        "rsub.Scalar", "rsub.Tensor", "div.Tensor_mode", "remainder.Scalar",
        "maximum", "minimum", "fmax", "fmin", "atan2", "where.self", "where.ScalarOther", "where.ScalarSelf",
        "masked_fill.Tensor", "masked_fill_.Tensor", "clamp", "clamp_",
        "clamp.Tensor", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "lerp.Scalar", "lerp_.Scalar",
        "lerp.Tensor", "lerp_.Tensor", "addcmul", "addcmul_", "addcdiv", "addcdiv_",
        // comparisons and logic
        "eq.Scalar", "eq.Tensor", "ne.Scalar", "ne.Tensor", "lt.Scalar", "lt.Tensor", "le.Scalar", "le.Tensor",
        "gt.Scalar", "gt.Tensor", "ge.Scalar", "ge.Tensor", "logical_not", "logical_and", "logical_or", "isnan",
        "isinf", "isfinite", "bitwise_not", "nan_to_num", "sgn", "logical_and_", "logical_or_", "logical_not_",
        "bitwise_and.Tensor", "bitwise_or.Tensor", "sign_", "clamp_min.Tensor", "clamp_max.Tensor",
    }),
    &pointwise_nonlinear);

}  // namespace
}  // namespace dtensor::ops
