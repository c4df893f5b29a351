// The small modules tests/oracle/tp_styles_oracle.py builds in Python, built the same way here (same
// submodule and parameter names, same shapes). Plain model code: nothing about parallelism but the
// call_with_hooks rule for modules a plan targets directly.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>

#include "dtensor/nn/layers.h"

namespace dtensor::testing {

// in_proj(8 -> 16), ReLU, out_proj(16 -> 8).
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    in_proj = register_module("in_proj", nn::Linear(8, 16));
    out_proj = register_module("out_proj", nn::Linear(16, 8));
  }
  at::Tensor forward(const at::Tensor& x) { return out_proj(at::relu(in_proj(x))); }
  nn::Linear in_proj{nullptr}, out_proj{nullptr};
};
TORCH_MODULE(Mlp);

// Llama's SwiGLU feed-forward: w2(silu(w1(x)) * w3(x)).
struct FeedForwardImpl : torch::nn::Module {
  FeedForwardImpl() {
    auto no_bias = [](int64_t in, int64_t out) { return torch::nn::LinearOptions(in, out).bias(false); };
    w1 = register_module("w1", nn::Linear(no_bias(8, 16)));
    w3 = register_module("w3", nn::Linear(no_bias(8, 16)));
    w2 = register_module("w2", nn::Linear(no_bias(16, 8)));
  }
  at::Tensor forward(const at::Tensor& x) {
    return nn::call_with_hooks(*this, {x}, [this](const nn::Tensors& in) { return w2(at::silu(w1(in[0])) * w3(in[0])); });
  }
  nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

// x + ffn(norm(x)).
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    norm = register_module("norm", nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    ffn = register_module("ffn", FeedForward());
  }
  at::Tensor forward(const at::Tensor& x) { return x + ffn(norm(x)); }
  nn::LayerNorm norm{nullptr};
  FeedForward ffn{nullptr};
};
TORCH_MODULE(Block);

// forward(x, bias = None, *, scale = None) = lin(x) (+ bias) (* scale); `scale` is a keyword input.
struct KwModelImpl : torch::nn::Module {
  KwModelImpl() { lin = register_module("lin", nn::Linear(8, 8)); }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& bias = {}, const at::Tensor& scale = {}) {
    return nn::call_with_hooks(*this, {x, bias}, {{"scale", scale}}, [this](const nn::Tensors& args, const nn::Kwargs& kw) {
      at::Tensor y = lin(args[0]);
      if (args[1].defined()) y = y + args[1];
      if (kw.at("scale").defined()) y = y * kw.at("scale");
      return y;
    });
  }
  nn::Linear lin{nullptr};
};
TORCH_MODULE(KwModel);

// A model by the oracle's name, with a forward taking positional and keyword inputs.
struct SmallModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const nn::Tensors&, const nn::Kwargs&)> forward;
};

inline SmallModel make_small_model(const std::string& name) {
  auto wrap = [](auto holder, auto fwd) {
    return SmallModel{std::static_pointer_cast<torch::nn::Module>(holder.ptr()),
                      [holder, fwd](const nn::Tensors& a, const nn::Kwargs& k) { return fwd(holder, a, k); }};
  };
  auto one = [](auto h, const nn::Tensors& a, const nn::Kwargs&) { return h->forward(a[0]); };
  if (name == "linear") return wrap(nn::Linear(8, 12), one);
  if (name == "linear_nobias") return wrap(nn::Linear(torch::nn::LinearOptions(8, 12).bias(false)), one);
  if (name == "mlp") return wrap(Mlp(), one);
  if (name == "embedding") return wrap(nn::Embedding(16, 8), one);
  if (name == "layernorm") return wrap(nn::LayerNorm(torch::nn::LayerNormOptions({8})), one);
  if (name == "rmsnorm") return wrap(nn::RMSNorm(8, 1e-6), one);
  if (name == "block") return wrap(Block(), one);
  if (name == "kwmodel") {
    return wrap(KwModel(), [](auto h, const nn::Tensors& a, const nn::Kwargs& k) {
      auto scale = k.find("scale");
      return h->forward(a[0], a.size() > 1 ? a[1] : at::Tensor(), scale == k.end() ? at::Tensor() : scale->second);
    });
  }
  throw std::invalid_argument("no small model named '" + name + "'");
}

}  // namespace dtensor::testing
