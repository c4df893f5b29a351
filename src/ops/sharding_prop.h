// Sharding propagation for ops on DTensors (PyTorch's _op_schema.py + _sharding_prop.py + _dispatch.py).
//
// An op family registers a strategy: given the op's inputs (their specs, shapes and the non-tensor args) it
// decides which placements each DTensor input must have and which placements each output gets. The
// generic runner then
//   1. looks the decision up in a per-thread cache keyed by (op, input specs, non-tensor args),
//   2. on a miss, asks the strategy and runs the op on meta tensors of the global shapes to learn the
//      outputs' global shapes, strides and dtypes,
//   3. redistributes inputs whose placements differ from the decision,
//   4. runs the op on the local shards (below autograd),
//   5. wraps the outputs as DTensors (in-place ops return their input wrapper; out= ops update theirs).
// Internal header.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string>
#include <vector>

#include "dtensor/ops/sharding_strategy.h"
#include "dtensor/tensor/dtensor_spec.h"
#include "ops/dispatch.h"

namespace dtensor::ops {

// Registers `strategy` for the ops; they run through run_strategy.
void register_strategy(const std::vector<std::string>& qualified_names, StrategyFn strategy);
struct StrategyRegistration {
  StrategyRegistration(const std::vector<std::string>& names, StrategyFn strategy) { register_strategy(names, strategy); }
};
bool has_strategy(const std::string& qualified_name);

// The generic runner (steps 1-5 above).
void run_strategy(const c10::OperatorHandle& op, torch::jit::Stack* stack, StrategyFn strategy);



}  // namespace dtensor::ops
