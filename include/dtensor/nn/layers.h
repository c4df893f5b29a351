// Standard layers that parallel styles can hook: torch::nn's Linear, Embedding, LayerNorm and Dropout with
// their forward run through call_with_hooks, and an RMSNorm (LibTorch has none). Same options, same
// numerics; with no plan applied they are exactly torch::nn's.
#pragma once

#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include "dtensor/nn/default_device.h"
#include "dtensor/nn/module_hooks.h"

namespace dtensor::nn {

class LinearImpl : public torch::nn::LinearImpl {
 public:
  LinearImpl(int64_t in_features, int64_t out_features) : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options);
  at::Tensor forward(const at::Tensor& input);
};
TORCH_MODULE(Linear);

class EmbeddingImpl : public torch::nn::EmbeddingImpl {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
      : EmbeddingImpl(torch::nn::EmbeddingOptions(num_embeddings, embedding_dim)) {}
  explicit EmbeddingImpl(const torch::nn::EmbeddingOptions& options);
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
