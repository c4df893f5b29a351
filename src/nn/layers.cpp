#include "dtensor/nn/layers.h"

#include <ATen/ATen.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/bf16_gemm.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/nn/parameter_replacement.h"

namespace dtensor::nn {

namespace {

// torch::nn's layers allocate their parameters on the CPU in their constructors. Under a
// DefaultDeviceGuard we let them build a 1-element stand-in instead, then register the real shapes on the
// guard's device (replace_parameter) and run the layer's own initialization there.
// The innermost DefaultDeviceGuard's device (default_device.h), if any.
std::optional<at::Device> guarded_device() { return DefaultDeviceGuard::current(); }

torch::nn::LinearOptions stand_in(const torch::nn::LinearOptions& o) {
  return guarded_device() ? torch::nn::LinearOptions(1, 1).bias(o.bias()) : o;
}
torch::nn::EmbeddingOptions stand_in(const torch::nn::EmbeddingOptions& o) {
  if (!guarded_device()) return o;
  DTENSOR_CHECK(!o._weight().defined(),
                "dtensor: nn::Embedding with a given _weight cannot be built under a DefaultDeviceGuard");
  return torch::nn::EmbeddingOptions(1, 1);
}
at::TensorOptions parameter_options() {
  return guarded_device() ? at::TensorOptions().device(*guarded_device()) : at::TensorOptions();
}
// A parameter of `shape` on the guard's device (uninitialized: the layer's reset_parameters fills it).
at::Tensor new_parameter(at::IntArrayRef shape) { return at::empty(shape, parameter_options()).requires_grad_(); }
}  // namespace

LinearImpl::LinearImpl(const torch::nn::LinearOptions& o) : torch::nn::LinearImpl(stand_in(o)) {
  if (!guarded_device()) return;
  options = o;
  replace_parameter(*this, "weight", new_parameter({o.out_features(), o.in_features()}));
  if (o.bias()) replace_parameter(*this, "bias", new_parameter({o.out_features()}));
  reset_parameters();
}

EmbeddingImpl::EmbeddingImpl(const torch::nn::EmbeddingOptions& o) : torch::nn::EmbeddingImpl(stand_in(o)) {
  if (!guarded_device()) return;
  options = o;
  replace_parameter(*this, "weight", new_parameter({o.num_embeddings(), o.embedding_dim()}));
  reset_parameters();
}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  // at::linear, as torch.nn.Linear: one fused addmm with the bias (the C++ frontend's F::linear adds it after the
  // matmul on 3-d inputs, a second rounding in bf16).
  return call_with_hooks(*this, {input}, [this](const Tensors& in) {
    const at::Tensor& x = in[0];
    // A bf16 decode step on plain tensors: the weight streamed by the fast kernel (core/fast_kernels.h; a sharded
    // linear reaches it through the DTensor kernel's local mm).
    if (!bias.defined() && x.dim() >= 2 && !is_dtensor(x) && !is_dtensor(weight)) {
      if (auto y = bf16_linear(x.reshape({-1, x.size(-1)}), weight)) {
        std::vector<int64_t> sizes = x.sizes().vec();
        sizes.back() = weight.size(0);
        return y->view(sizes);
      }
    }
    // A bf16 GEMM that the fast kernel does not take (a gradient, a bias) where PyTorch's bf16 GEMM is slow: in fp32
    // (core/bf16_gemm.h). A sharded decode step without bias keeps at::linear: its local mm reaches the fast kernel.
    const bool needs_grad = c10::GradMode::is_enabled() &&
                            (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
    if (needs_grad || bias.defined() || !is_dtensor(x)) {
      if (auto y = bf16_linear_via_fp32(x, weight, bias)) return *y;
    }
    return at::linear(x, weight, bias);
  });
}

at::Tensor EmbeddingImpl::forward(const at::Tensor& input) {
  return call_with_hooks(*this, {input}, [this](const Tensors& in) { return torch::nn::EmbeddingImpl::forward(in[0]); });
}

at::Tensor LayerNormImpl::forward(const at::Tensor& input) {
  return call_with_hooks(*this, {input}, [this](const Tensors& in) { return torch::nn::LayerNormImpl::forward(in[0]); });
}

at::Tensor DropoutImpl::forward(const at::Tensor& input) {
  return call_with_hooks(*this, {input}, [this](const Tensors& in) { return torch::nn::DropoutImpl::forward(in[0]); });
}

RMSNormImpl::RMSNormImpl(int64_t dim_, double eps_) : dim(dim_), eps(eps_) { reset(); }

void RMSNormImpl::reset() { weight = register_parameter("weight", at::ones({dim}, parameter_options())); }

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  return call_with_hooks(*this, {input}, [this](const Tensors& in) { return at::rms_norm(in[0], {dim}, weight, eps); });
}

}  // namespace dtensor::nn
