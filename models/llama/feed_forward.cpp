#include "llama/feed_forward.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

namespace llama {

dtensor::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return dtensor::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

at::Tensor activation(const std::string& act, const at::Tensor& x) {
  if (act == "silu") return at::silu(x);
  if (act == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
  return at::gelu(x);  // "gelu": exact (validated in config.cpp)
}

FeedForwardImpl::FeedForwardImpl(const LlamaConfig& c, int64_t intermediate) : act(c.mlp.hidden_act) {
  const int64_t inner = intermediate > 0 ? intermediate : c.intermediate_size;
  if (c.mlp.kind == MlpKind::plain) {
    c_fc = register_module("c_fc", linear(c.hidden_size, inner, c.mlp.mlp_bias));
    c_proj = register_module("c_proj", linear(inner, c.hidden_size, c.mlp.mlp_bias));
    return;
  }
  gate_proj = register_module("gate_proj", linear(c.hidden_size, inner, c.mlp.mlp_bias));
  up_proj = register_module("up_proj", linear(c.hidden_size, inner, c.mlp.mlp_bias));
  down_proj = register_module("down_proj", linear(inner, c.hidden_size, c.mlp.mlp_bias));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  if (c_fc) return c_proj(activation(act, c_fc(x)));
  return down_proj(activation(act, gate_proj(x)) * up_proj(x));
}

}  // namespace llama
