// Weight-only int4 quantization of Linear layers, group-wise (torchao's quantize_(model, Int4WeightOnlyConfig(
// group_size)) on the CPU: PrototypeInt4WeightOnlyConfig, Int4OpaqueTensor, tinygemm's numerics; "W4A16"): each
// group of `group_size` consecutive weights of a row (along in_features k) becomes 4-bit values v in [0, 15] and one
// scale s and zero z, w = (v - 8) * s + z; the activations stay in the model's dtype. Half a byte a weight (plus the
// group's scale and zero): a decode step reads a quarter of bf16's bytes.
//
//   dtensor::quant::quantize_(*model, dtensor::quant::Int4WeightOnlyConfig{.group_size = 128});
//
// The numbers are torchao's (_choose_qparams_affine_tinygemm then _quantize_affine_tinygemm, ASYMMETRIC, quant_min 0,
// quant_max 15, eps 1e-6, scale and zero in the weight's dtype), bit for bit, each op in the weight's dtype:
//   s = max((max_g w - min_g w) / 15, 1e-6)     z = min_g w + s * 8
//   v = clamp(round_half_even((w - (z - s * 8)) / s), 0, 15)
// A GGUF Q4_0 block is the same form with z = 0 and s its fp16 d (models/llama/gguf_weights.h keeps it so, exact).
//
// The layout: q uint8 [N, K / 2], each 32 values of a row in 16 bytes, byte j holding value j (low nibble) and value
// j + 16 (high nibble), Q4_0's order; scale and zero [N, K / group_size] (fp32, bf16 or fp16, the same; zero may be
// undefined: 0). The matmul: the fast path (dtensor/core/fast_kernels.h int4_weight_linear) builds each group's 16
// weights in fp32 and sums in fp32, one rounding; the reference (DTENSOR_FAST_KERNELS=0, any CPU) dequantizes w into
// x's dtype and runs mm: the two agree within a rounding of w and of the output to x's dtype.
//
// Under TP the packed weight keeps the placement the plan gave the weight, its scales and zeros the same one (a row's
// groups lie along k as its values do):
//   Colwise  W Shard(0)  q, s, z Shard(0): x Replicate . w^T -> Shard(-1), each rank its rows with their groups
//   Rowwise  W Shard(1)  q, s, z Shard(1): x Shard(-1) . w^T -> Partial, each rank whole groups of every row: k's
//                        shards must not cut a group, in_features % (degree * group_size) == 0; another degree is
//                        refused naming the degrees that keep whole groups
//   Replicate            q, s, z Replicate
// Other layouts are refused by name, as are a layer another pass replaced, one with an adapter, one whose in_features
// group_size does not divide (torchao skips such a layer quietly; naming the group sizes that do divide here).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "dtensor/quant/int8_weight_only.h"  // ModuleFilter

namespace dtensor::quant {

// torchao's Int4WeightOnlyConfig / PrototypeInt4WeightOnlyConfig (tinygemm's choose_qparams): group_size 32, 64,
// 128 (its default) or 256.
struct Int4WeightOnlyConfig {
  int64_t group_size = 128;
};

// One weight's int4 form (the layout above): q [N, K / 2] uint8, scale and zero [N, K / group_size].
struct Int4Weight {
  at::Tensor q, scale, zero;
  int64_t group_size = 0;
};

// torchao's quantize_ with Int4WeightOnlyConfig: every dtensor::nn::Linear that `filter` accepts (none: all, lm_head
// included) gets its weight replaced by the packed values (a DTensor where the weight was one, same placements,
// requires_grad false) and buffers `weight_scale`, `weight_zero`; its forward computes int4_weight_only_linear.
// Returns the converted layers' names in module order.
std::vector<std::string> quantize_(torch::nn::Module& model, const Int4WeightOnlyConfig& config,
                                   const ModuleFilter& filter = {});

// Installs an int4 weight already made (a GGUF Q4_0 tensor's blocks) on the dtensor::nn::Linear `module` named `fqn`:
// the parts plain, or DTensors placed as the layer's weight (above). The layer's old weight is dropped.
void set_int4_weight(torch::nn::Module& module, const std::string& fqn, const Int4Weight& weight);

// Whether int4_weight_only_linear has its fast kernels here (AVX-512F or AVX2 + FMA + F16C, fast kernels on). Without
// them it dequantizes each weight per call: a loader that can choose (a GGUF's Q4_0 tensors) loads them dequantized
// instead, which gives the same numbers faster.
bool int4_kernels_available();

// Whether `module` computes through an int4 weight.
bool is_int4_weight_only(const torch::nn::Module& module);

// torchao's group-wise quantization of a plain 2-D floating weight [N, K] (K % group_size == 0), in its dtype.
Int4Weight quantize_groupwise(const at::Tensor& weight, int64_t group_size);
// Values v [N, K] (uint8 in [0, 15]) packed into the layout's bytes, and back.
at::Tensor pack_int4(const at::Tensor& values);
at::Tensor unpack_int4(const at::Tensor& q);
// The reference dequantization, (v - 8) * s + z in fp32, returned in `dtype` (plain tensors).
at::Tensor dequantize_int4(const Int4Weight& weight, at::ScalarType dtype);

// y = x w^T for x [..., K] (plain, or a DTensor with the parts DTensors in the layouts above).
at::Tensor int4_weight_only_linear(const at::Tensor& x, const Int4Weight& weight);

}  // namespace dtensor::quant
