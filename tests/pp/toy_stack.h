// The pipeline tests' model (tests/oracle/pp_oracle.py builds the same in PyTorch): L layers, layer i
// y = tanh(x W_i^T + b_i), the last without tanh, the loss mse_loss; trained with plain SGD. Stage k of S holds layers
// [k L / S, (k + 1) L / S) and lives on rank k % pp.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "dtensor/pp/schedule.h"

namespace pp_test {

struct Layer {
  at::Tensor w, b;  // leaves requiring grad
};

at::Tensor run_layers(const std::vector<Layer>& layers, int first, int last, at::Tensor x);
at::Tensor mse(const at::Tensor& out, const at::Tensor& target);

struct Result {
  std::vector<double> losses;               // per step, the mean over microbatches
  std::map<std::string, at::Tensor> grads;  // "layers.<i>.weight" / ".bias" after the first step, before SGD
  std::map<std::string, at::Tensor> final_params;
};

// The unsplit stack: gradient accumulation over m microbatches (each loss / m), SGD at lr. xs, ys: [steps, batch, dim].
Result train_reference(std::vector<Layer> layers, const at::Tensor& xs, const at::Tensor& ys, int m, double lr);
// The same through dtensor::pp at `spec` (ranks as threads over Gloo; every rank starts from copies of `layers`).
Result train_pipelined(const std::vector<Layer>& layers, const at::Tensor& xs, const at::Tensor& ys,
                       const dtensor::pp::ScheduleSpec& spec, double lr);

}  // namespace pp_test
