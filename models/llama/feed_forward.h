// The dense MLP of a decoder layer (and Qwen2-MoE's shared expert).
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "dtensor/nn/hooked_module.h"
#include "dtensor/nn/layers.h"
#include "llama/config.h"

namespace llama {

// The Linear every projection is: torch::nn's options, hookable by a plan.
dtensor::nn::Linear linear(int64_t in, int64_t out, bool bias = false);

// The activation hidden_act names (silu, gelu_pytorch_tanh, gelu).
at::Tensor activation(const std::string& act, const at::Tensor& x);

// Gated (SwiGLU, GeGLU): down_proj(act(gate_proj(x)) * up_proj(x)); plain (StarCoder2): c_proj(act(c_fc(x))).
// intermediate 0: config.intermediate_size.
struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(const LlamaConfig& config, int64_t intermediate = 0);
  at::Tensor forward(const at::Tensor& x);
  std::string act;
  dtensor::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};  // gated
  dtensor::nn::Linear c_fc{nullptr}, c_proj{nullptr};                             // plain
};
DTENSOR_MODULE(FeedForward);

}  // namespace llama
