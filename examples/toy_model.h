// The seeds' ToyModel (Linear(10, 32) - ReLU - Linear(32, 5)), with no parallel code in it.
#pragma once

#include <torch/nn/modules/activation.h>
#include <torch/nn/module.h>

#include "dtensor/nn/layers.h"

struct ToyModelImpl : torch::nn::Module {
  ToyModelImpl()
      : in_proj(register_module("in_proj", dtensor::nn::Linear(10, 32))),
        relu(register_module("relu", torch::nn::ReLU())),
        out_proj(register_module("out_proj", dtensor::nn::Linear(32, 5))) {}

  at::Tensor forward(const at::Tensor& x) { return out_proj(relu(in_proj(x))); }

  dtensor::nn::Linear in_proj;
  torch::nn::ReLU relu;
  dtensor::nn::Linear out_proj;
};
TORCH_MODULE(ToyModel);
