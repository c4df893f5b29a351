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
// _scaled_mm(a, b, 1 / scale_a, 1 / scale_b) gives a @ b in the layer's compute dtype (or its emulation, chosen by
// measurement: Float8MatmulKind). Backward:
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
#include <optional>
#include <string>
#include <vector>

namespace dtensor {

enum class Float8Recipe { tensorwise, rowwise };
std::string to_string(Float8Recipe recipe);
Float8Recipe float8_recipe_from_string(const std::string& name);  // "tensorwise" | "rowwise"; else dtensor::Error

// How the float8 matmuls run (llama_train --float8-matmul), each equal to _scaled_mm's a @ b * inv_a * inv_b:
//   scaled_mm      at::_scaled_mm, the device's float8 GEMM (on CUDA: float8 tensor cores);
//   emulated       the float8 operands widened exactly to fp32 and scaled, an fp32 GEMM: PyTorch's own CPU fallback
//                  of _scaled_mm, bit for bit (and torchao's emulate=True);
//   emulated_bf16  a bf16 GEMM of the float8 values (the products exact, summed in fp32, the sum rounded to bf16 once),
//                  then the scales;
//   auto           the fastest, timed on the layer's shapes once per process and shape class (on CUDA: scaled_mm);
//                  emulated_bf16 only where the layer computes in bf16 (an fp32 layer keeps fp32 sums). Why: a CPU's
//                  _scaled_mm may be a scalar reference loop (oneDNN on Intel AMX machines: 100x a bf16 GEMM) where
//                  the emulation runs at its GEMM's speed. Ranks of a mesh pick alike.
enum class Float8MatmulKind { auto_select, scaled_mm, emulated, emulated_bf16 };
std::string to_string(Float8MatmulKind kind);                       // "auto", "scaled_mm", "emulated", "emulated_bf16"
Float8MatmulKind float8_matmul_from_string(const std::string& name);  // else dtensor::Error naming the choices

struct Float8LinearConfig {
  Float8Recipe recipe = Float8Recipe::tensorwise;
  Float8MatmulKind matmul = Float8MatmulKind::auto_select;
};

class ProcessGroup;

// The measurement `auto` makes: each kind's milliseconds for a layer's three matmuls of a training step (forward
// x [m, k] @ w^T [k, n], grad_input [m, n] @ [n, k], grad_weight [n, m] @ [m, k]; m capped at 256 and k, n at 2048; a
// kind after the first timed on a probe shape (32 x 256 x 256 at most) first, and one whose probe, scaled by the FLOPs,
// is already 4x the best keeps that estimate, written "~"), on `options`' device, and the fastest; emulated_bf16 is
// timed only if `options`' dtype (the layer's compute dtype) is bf16, else its time is infinite. With `agree`, the
// timings are summed over its ranks first (every rank of it calls this at once), so that all pick the same kind.
struct Float8MatmulTimings {
  double scaled_mm_ms = 0, emulated_ms = 0, emulated_bf16_ms = 0;
  bool scaled_mm_estimated = false, emulated_estimated = false;  // from the probe (emulated_bf16, timed first: never)
  Float8MatmulKind fastest = Float8MatmulKind::scaled_mm;
  std::string to_string() const;  // "emulated_bf16 (scaled_mm ~5730.1 ms, emulated 47.6 ms, emulated_bf16 13.2 ms)"
};
Float8MatmulTimings time_float8_matmuls(int64_t m, int64_t k, int64_t n, const at::TensorOptions& options,
                                        ProcessGroup* agree = nullptr);

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
// The float8 cast of `hp` with `scale` (broadcast against it): clamp(hp * scale, +-max) in `dtype` (fp32 product,
// round to nearest even), strides kept where hp is dense. One scale on a dense fp32 / bf16 CPU tensor: one pass of
// an AVX2 kernel where the CPU has it (bit for bit the reference's ATen ops, which DTENSOR_FAST_KERNELS=0 runs).
at::Tensor cast(const at::Tensor& hp, const at::Tensor& scale, at::ScalarType dtype);
// max |hp| over all of it, or along `dim` (kept as a size-1 dim), in hp's dtype.
at::Tensor abs_max(const at::Tensor& hp, std::optional<int64_t> dim = std::nullopt);
// fp8_max / max(amax, eps) in fp32; rowwise: rounded down to a power of two.
at::Tensor amax_to_scale(const at::Tensor& amax, at::ScalarType dtype, bool power_of_two);
}  // namespace float8

}  // namespace dtensor
