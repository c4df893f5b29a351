// The Colwise / Rowwise pair the weight passes' TP tests share (int8, int4, prepack): two bias-free bf16 Linears
// holding TP 1's weights w_up [hidden, in] and w_down [in, hidden], parallelized over a 1-D mesh.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/modules/container/sequential.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/layers.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"

namespace dtensor::testing {

struct TpPair {
  dtensor::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::Sequential both{nullptr};
};

inline TpPair colwise_rowwise_pair(const dtensor::DeviceMesh& mesh, const at::Tensor& w_up, const at::Tensor& w_down) {
  at::NoGradGuard no_grad;
  TpPair p;
  p.up = dtensor::nn::Linear(torch::nn::LinearOptions(w_up.size(1), w_up.size(0)).bias(false));
  p.down = dtensor::nn::Linear(torch::nn::LinearOptions(w_down.size(1), w_down.size(0)).bias(false));
  p.up->to(at::kBFloat16);
  p.down->to(at::kBFloat16);
  p.up->weight.copy_(w_up);
  p.down->weight.copy_(w_down);
  dtensor::parallelize_module(*p.up, mesh, dtensor::ColwiseParallel());
  dtensor::parallelize_module(*p.down, mesh, dtensor::RowwiseParallel());
  p.both = torch::nn::Sequential(p.up, p.down);
  return p;
}

}  // namespace dtensor::testing
