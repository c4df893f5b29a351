// Standard layers that parallel styles can hook: torch::nn's Linear, Embedding, LayerNorm and Dropout with
// their forward run through call_with_hooks, and an RMSNorm (LibTorch has none). Same options, same
// numerics; with no plan applied they are exactly torch::nn's.
#pragma once

#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "dtensor/parallel/module_hooks.h"

namespace dtensor::nn {

class LinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::EmbeddingImpl {
 public:
  using torch::nn::EmbeddingImpl::EmbeddingImpl;
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(Embedding);

class LayerNormImpl : public torch::nn::LayerNormImpl {
 public:
  using torch::nn::LayerNormImpl::LayerNormImpl;
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(LayerNorm);

class DropoutImpl : public torch::nn::DropoutImpl {
 public:
  using torch::nn::DropoutImpl::DropoutImpl;
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(Dropout);

// y = x / sqrt(mean(x^2, last dim) + eps) * weight.
class RMSNormImpl : public torch::nn::Cloneable<RMSNormImpl> {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  void reset() override;
  at::Tensor forward(const at::Tensor& input);
  int64_t dim;
  double eps;
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

}  // namespace dtensor::nn
