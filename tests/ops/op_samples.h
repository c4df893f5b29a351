// The table of sample inputs the op checker runs: one entry per covered op, driving both the placement
// sweep (test_op_checker.cpp) and the coverage table in docs/.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace dtensor::testing {

struct OpSample {
  std::string name;                 // what the sample exercises ("add", "mm", "view (flatten)", ...)
  std::vector<at::Tensor> inputs;   // full-size inputs
  std::function<at::Tensor(const std::vector<at::Tensor>&)> fn;  // the op, on plain tensors or DTensors
  std::vector<bool> differentiable;  // per input: check its gradient (float inputs only)
  std::vector<bool> may_shard;       // per input: include Shard placements
  std::vector<bool> may_partial;     // per input: include Partial(sum) placements
  bool may_refuse = false;           // some placements are refused with a clear error (views)
  double tolerance = 1e-5;
};

std::vector<OpSample> op_samples();

}  // namespace dtensor::testing
