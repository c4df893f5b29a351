// Weight-only int8 quantization of Linear layers (torchao's quantize_(model, Int8WeightOnlyConfig()), its per-row
// granularity; "W8A16"): each weight row n becomes int8 values q[n][k] and one fp32 scale s[n], the activations stay
// in the model's dtype, and y = x q^T * s. A weight is then one byte a value: decode, which reads every weight once
// per token, reads half the bytes of bf16.
//
//   dtensor::quant::quantize_(*model, dtensor::quant::Int8WeightOnlyConfig{});   // after the weights are loaded
//
// The numbers are torchao's (choose_qparams_affine, MappingType.SYMMETRIC, then quantize_affine), bit for bit:
//   amax[n] = max(-min(min_k w[n][k], 0), max(max_k w[n][k], 0))  in w's dtype
//   s[n]    = max(amax[n] / 127.5, fp32 eps)                      in w's dtype, stored as fp32
//   q[n][k] = clamp(round_half_even(w[n][k] * (1 / s[n])), -128, 127)   in fp32
// The matmul: the fast path (dtensor/core/fast_kernels.h int8_weight_linear: bf16 on a CPU with the kernels) rounds
// once, bf16(s[n] * fp32 sum_k x[m][k] q[n][k]); the reference (any dtype, DTENSOR_FAST_KERNELS=0) is torchao's
// formula, mm(x, q^T in x's dtype) * s in x's dtype, two roundings: the two differ within a bf16 rounding of the output.
//
// Under TP the int8 weight keeps the placement the plan gave the weight, and the scales follow the rows they scale
// (one scale per output row n):
//   Colwise  W Shard(0)  q Shard(0), s Shard(0): x Replicate . q^T -> Shard(-1), each rank its rows' scales
//   Rowwise  W Shard(1)  q Shard(1), s Replicate: x Shard(-1) . q^T -> Partial; s[n] times a partial sum over k is
//                        that rank's part of s[n] times the whole sum, so the style's one reduction sums scaled parts.
//                        amax[n] is the max over the whole row: the ranks' local maxima all-reduced (MAX) over the
//                        mesh dims that shard k, so every rank quantizes its columns with torchao's one scale.
//   Replicate            q, s Replicate (and an input sharded along a dim other than k keeps its placement)
// Other layouts are refused by name, as is a layer whose forward another pass replaced (float8, async TP), one with
// an adapter (LoRA on a quantized base, QLoRA, is not done), and a weight that is no floating tensor.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::quant {

// torchao's Int8WeightOnlyConfig(granularity=PerRow()) (version 2, its default): nothing to choose yet.
struct Int8WeightOnlyConfig {};

// Which layers quantize_ converts (torchao's filter_fn): `fqn` is the module's name in the model.
using ModuleFilter = std::function<bool(const std::string& fqn, torch::nn::Module& module)>;

// torchao's quantize_: every dtensor::nn::Linear of `model` that `filter` accepts (none given: all of them, torchao's
// default, lm_head included) gets its weight replaced by the int8 values (a DTensor where the weight was one, same
// placements, requires_grad false) and a buffer `weight_scale` (fp32 [out_features]), and its forward computes
// int8_weight_only_linear. A tied weight (lm_head = embed_tokens) is untied: the embedding keeps its own. Returns the
// converted layers' names in module order.
std::vector<std::string> quantize_(torch::nn::Module& model, const Int8WeightOnlyConfig& config,
                                   const ModuleFilter& filter = {});

// Whether `module` is a Linear that quantize_ converted.
bool is_int8_weight_only(const torch::nn::Module& module);

// The per-row quantization of a plain 2-D floating weight [N, K]: (q int8 [N, K], s fp32 [N]), as above.
// `amax`, when given, replaces the row maxima (the whole rows' under a Shard(1) weight).
std::pair<at::Tensor, at::Tensor> quantize_per_row(const at::Tensor& weight, const at::Tensor& amax = {});
// The row maxima quantize_per_row uses: [N] in w's dtype.
at::Tensor row_abs_max(const at::Tensor& weight);

// y = x q^T * s for x [..., K] (plain, or a DTensor with q and s DTensors in the layouts above).
at::Tensor int8_weight_only_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale);

}  // namespace dtensor::quant
