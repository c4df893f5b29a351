// The global shape, stride and dtype of an op's outputs, which the wrapped DTensors carry. Learnt once per
// decision-cache key: from the strategy (ops without a C++ meta kernel), from a run of the op on meta
// tensors of the inputs' global shapes, or, failing both, from the first local run (one size exchange per
// sharded output dim). Internal header.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <vector>

#include "dtensor/ops/sharding_strategy.h"

namespace dtensor::ops {

struct OutputMeta {
  std::vector<int64_t> shape, stride;
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // Undefined: an undefined output (a skipped gradient)
};

// Runs the op on meta tensors of the inputs' global shapes; throws c10::Error when it has no meta kernel.
std::vector<OutputMeta> meta_outputs(const OpCall& call);
// True on this thread while meta_outputs runs an op: observers of ops (the dry run's FLOP count) skip it, as
// it is the dispatch's shape inference, not work a rank does.
bool in_shape_inference();

// For ops without a meta kernel: each output's global shape from its local shape and placements, summing
// the sizes of sharded dims over each sharding mesh dim's group (innermost first). Every rank takes this
// path for the same key, so the exchanges match up. Strides are taken contiguous.
std::vector<OutputMeta> global_outputs_from_locals(const DeviceMesh& mesh, const std::vector<Placements>& placements,
                                                   const torch::jit::Stack& stack, size_t num_returns);

// Index (within the op's inputs) of the argument an in-place or out= return aliases, or -1.
int written_input_for_return(const c10::FunctionSchema& schema, size_t ret);

}  // namespace dtensor::ops
