// The float8 parallel styles (torchao's float8_tensor_parallel, torchtitan's apply_tp with float8 tensorwise): for
// Linear layers converted by convert_to_float8_training (dtensor/float8/float8_linear.h), the activations that a plain
// style all-gathers in high precision are all-gathered in float8.
//
//   Float8ColwiseParallel    ColwiseParallel; an input arriving Shard(d) is cast to e4m3 (one scale: its amax
//                            all-reduced over the TP group) and all-gathered as float8 bytes, then dequantized into
//                            the Replicate input (the layer casts it again to the same float8 values). Backward: the
//                            gradient's Partial -> Shard(d) reduce-scatter in high precision, as PyTorch's.
//   Float8RowwiseParallel    RowwiseParallel; the output's Partial -> Shard(d) reduce-scatter in high precision, its
//                            backward all-gather of the gradient in e5m2 bytes. (To Replicate: an all-reduce both
//                            ways, as the plain style.)
//   PrepareFloat8ModuleInput PrepareModuleInput; each positional input going Shard(d) -> Replicate is gathered in
//                            float8 once, so that q/k/v (gate/up) share one float8 all-gather.
// The float8 all-gather moves a quarter of fp32's bytes (half of bf16's). The rowwise recipe keeps the plain styles
// (high-precision collectives), as torchtitan does.
#pragma once

#include "dtensor/tp/style.h"

namespace dtensor {

struct Float8ColwiseParallel : ColwiseParallel {
  using ColwiseParallel::ColwiseParallel;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "Float8ColwiseParallel"; }
};

struct Float8RowwiseParallel : RowwiseParallel {
  using RowwiseParallel::RowwiseParallel;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "Float8RowwiseParallel"; }
};

struct PrepareFloat8ModuleInput : PrepareModuleInput {
  using PrepareModuleInput::PrepareModuleInput;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareFloat8ModuleInput"; }
};

// The collectives under the styles, on a DTensor of a 1-D mesh. Differentiable.
// Shard(d) -> Replicate with the bytes in e4m3: the dequantized Replicate DTensor in `dtensor`'s dtype; backward
// redistributes the gradient to Shard(d) (a reduce-scatter of a Partial gradient).
at::Tensor float8_all_gather(const at::Tensor& dtensor);
// Partial -> Shard(d) in `dtensor`'s dtype (a reduce-scatter); backward all-gathers the gradient in e5m2 bytes.
at::Tensor reduce_scatter_float8_backward(const at::Tensor& dtensor, int64_t d);

}  // namespace dtensor
