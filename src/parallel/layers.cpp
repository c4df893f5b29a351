#include "dtensor/parallel/layers.h"

#include <ATen/ATen.h>

namespace dtensor::nn {

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  return call_with_hooks(*this, {input}, [this](const Tensors& in) { return torch::nn::LinearImpl::forward(in[0]); });
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

void RMSNormImpl::reset() { weight = register_parameter("weight", at::ones({dim})); }

at::Tensor RMSNormImpl::forward(const at::Tensor& input) {
  return call_with_hooks(*this, {input}, [this](const Tensors& in) { return at::rms_norm(in[0], {dim}, weight, eps); });
}

}  // namespace dtensor::nn
