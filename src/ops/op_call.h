// Reading an op's inputs off the boxed stack: OpCall (declared in dtensor/ops/sharding_strategy.h, defined
// in op_call.cpp) and the small helpers custom handlers share. Internal header.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

#include "dtensor/ops/sharding_strategy.h"

namespace dtensor::ops {

// "aten::add.Tensor"
std::string op_name(const c10::OperatorHandle& op);
// "self: [Shard(dim=0)], other: [Replicate()]" for the tensor arguments among the stack's inputs.
std::string describe_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack);
// Throws dtensor::Error: "dtensor: <op> <why> (inputs: ...)".
[[noreturn]] void fail(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const std::string& why);

// Replaces each DTensor input with its local tensor (or with the next of `locals` when given, in the
// order the DTensor inputs appear) and runs the op on the plain tensors, below autograd. The outputs
// (plain) are left on the stack.
void call_local(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::vector<at::Tensor>* locals = nullptr);

// Index of the first DTensor among the op's inputs on the stack (the spec donor); -1 if none.
int first_dtensor_input(const c10::OperatorHandle& op, const torch::jit::Stack& stack);

}  // namespace dtensor::ops
