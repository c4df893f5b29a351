// Running an op whose rule is a sharding strategy (PyTorch's _sharding_prop.py + _dispatch.py), in four
// steps:
//   1. decide:        the decision for (op, input specs, non-tensor args) from this thread's DecisionCache,
//                     or, on a miss, from the strategy, with the outputs' global meta (output_meta.h);
//   2. redistribute:  each input whose placements differ from the decision moves (in-place and out=
//                     arguments must not); plain replicated tensors are cut locally;
//   3. run:           the same op on the local shards, below autograd (the wrapper carries the history);
//   4. wrap:          the outputs become DTensors with the decided placements and the global meta
//                     (in-place ops return their input wrapper; out= ops update theirs).
// Internal header.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include "dtensor/ops/sharding_strategy.h"

namespace dtensor::ops {

void run_strategy(const c10::OperatorHandle& op, torch::jit::Stack* stack, StrategyFn strategy);

}  // namespace dtensor::ops
