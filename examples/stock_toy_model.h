// The seeds' ToyModel as PyTorch writes it: plain torch::nn::Linear layers, nothing for parallelism
// (examples/toy_model.h is the same model of dtensor::nn's hookable layers).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>

struct StockToyModelImpl : torch::nn::Module {
  StockToyModelImpl()
      : in_proj(register_module("in_proj", torch::nn::Linear(10, 32))),
        relu(register_module("relu", torch::nn::ReLU())),
        out_proj(register_module("out_proj", torch::nn::Linear(32, 5))) {}

  at::Tensor forward(const at::Tensor& x) { return out_proj(relu(in_proj(x))); }

  torch::nn::Linear in_proj;
  torch::nn::ReLU relu;
  torch::nn::Linear out_proj;
};
TORCH_MODULE(StockToyModel);
