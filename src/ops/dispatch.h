// The DTensor dispatch key's entry point: one boxed kernel for every op with a registered handler, and a
// fallback for all other ops that raises an error naming the op and the input placements.
// Internal header; the op families (tensor_ops.cpp, ...) register their handlers here.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <string>
#include <vector>

#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor::ops {

// A handler finds the op's inputs on the stack and must leave its outputs there, as a boxed kernel does.
using OpHandler = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Registers `handler` for a qualified op name with overload ("aten::add.Tensor", "aten::detach").
void register_op(const std::string& qualified_name, OpHandler handler);
// Registers at static-initialisation time: `static const OpRegistration r("aten::clone", &handler);`
struct OpRegistration {
  OpRegistration(const std::string& qualified_name, OpHandler handler) { register_op(qualified_name, handler); }
};
std::vector<std::string> registered_ops();

// Once per process, before the first DTensor exists: puts the DTensor kernel on every aten op that a
// composite-explicit kernel would otherwise run on the wrapper (see dispatch.cpp).
void ensure_composite_ops_covered();

// "aten::add.Tensor"
std::string op_name(const c10::OperatorHandle& op);
// "self: [Shard(dim=0)], other: [Replicate()]" for the DTensor arguments on the stack's inputs.
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
