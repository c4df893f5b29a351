// Float8 training of Linear layers (torchao.float8's Float8Linear and convert_to_float8_training): each matmul of a
// converted layer, forward and backward, runs through at::_scaled_mm on float8 operands with dynamic scales; the
// parameters, the optimizer and everything outside the layers stay as they were (fp32 masters, bf16 compute under
// mixed precision).
//
//   dtensor::convert_to_float8_training(*model, {.recipe = dtensor::Float8Recipe::tensorwise},
//                                       [](const std::string& fqn, torch::nn::Module&) { return fqn != "lm_head"; });
//
// The recipes (torchao's Float8LinearRecipeName):
//   tensorwise  one scale per tensor: amax = max|x|, scale = fp8_max / amax, x_fp8 = clamp(x * scale) in e4m3 for the
//               input and the weight, e5m2 for the output's gradient (its range is wider);
//   rowwise     one scale per row of each operand along the matmul's reduction dim, e4m3 everywhere, the scales
//               rounded down to powers of two.
// _scaled_mm(a, b, 1 / scale_a, 1 / scale_b) gives a @ b in the layer's compute dtype. Backward:
//   grad_input  = grad_output @ weight      (grad_output and weight cast again, scaled along N)
//   grad_weight = grad_output^T @ input     (scaled along M)
//
// Under tensor parallelism every shard of a tensor uses one scale, as torchao's DTensor amax: the amax of an operand
// sharded along a reduced dim is all-reduced (MAX) over the mesh dims that shard it. A converted layer computes on
// the local shards of the ColwiseParallel / RowwiseParallel layouts (input Replicate and weight Shard(0), output
// Shard(-1); input Shard(-1) and weight Shard(1), output Partial) and of replicated weights; others are refused by
// name.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

namespace dtensor {

enum class Float8Recipe { tensorwise, rowwise };
std::string to_string(Float8Recipe recipe);
Float8Recipe float8_recipe_from_string(const std::string& name);  // "tensorwise" | "rowwise"; else dtensor::Error

struct Float8LinearConfig {
  Float8Recipe recipe = Float8Recipe::tensorwise;
};

// torchao's module_filter_fn: (fully qualified name, module) -> convert it. Empty: every Linear.
using Float8ModuleFilter = std::function<bool(const std::string& fqn, torch::nn::Module& module)>;

// Every dtensor::nn::Linear under `module` (itself included) that `filter` accepts computes its matmuls in float8 from
// now on (the layer keeps its parameters and hooks; plans apply before or after). A selected layer whose
// in_features or out_features is not divisible by 16 (float8 GEMM tiles), that has a bias, or that is not a
// dtensor::nn::Linear is a dtensor::Error naming it, before any layer changes. Returns the converted layers' names.
std::vector<std::string> convert_to_float8_training(torch::nn::Module& module, const Float8LinearConfig& config = {},
                                                    const Float8ModuleFilter& filter = {});

// torchtitan's filter for a decoder: every Linear except the output projection ("lm_head", "output") and the MoE
// router ("gate"), whose logits stay in high precision.
bool default_float8_filter(const std::string& fqn, torch::nn::Module& module);

bool is_float8_linear(const torch::nn::Module& module);

// The float8 matmul itself, on plain tensors (the reference the layer's DTensor path reduces to): input [..., K],
// weight [N, K] -> [..., N] in input's dtype. Differentiable in both.
at::Tensor float8_linear(const at::Tensor& input, const at::Tensor& weight, const Float8LinearConfig& config = {});

namespace float8 {
// The float8 cast of `hp` with `scale` (broadcast against it): clamp(hp * scale, +-max) in `dtype`.
at::Tensor cast(const at::Tensor& hp, const at::Tensor& scale, at::ScalarType dtype);
// fp8_max / max(amax, eps) in fp32; rowwise: rounded down to a power of two.
at::Tensor amax_to_scale(const at::Tensor& amax, at::ScalarType dtype, bool power_of_two);
}  // namespace float8

}  // namespace dtensor
