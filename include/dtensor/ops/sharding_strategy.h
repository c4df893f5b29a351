// Sharding strategies: how an op's output placements follow from its inputs'. The op families in src/ops/
// register theirs; user code can register one for any op (its own custom ops included) with
// register_sharding, like PyTorch's torch.distributed.tensor.experimental.register_sharding.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <optional>
#include <string>
#include <vector>

#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor {
namespace ops {

// One tensor among an op's inputs: a DTensor (spec set), a plain 0-d tensor (a replicated scalar), or a
// plain tensor treated as replicated under ImplicitReplicationGuard.
struct TensorInput {
  int arg;             // schema argument index
  int list_index;      // index within a Tensor[] argument, -1 for a plain Tensor argument
  at::Tensor tensor;
  const DTensorSpec* spec;  // null for plain tensors
  bool is_scalar() const { return spec == nullptr && tensor.dim() == 0; }
};

// The op's inputs as strategies see them.
class OpCall {
 public:
  OpCall(const c10::OperatorHandle& op, torch::jit::Stack* stack);

  const c10::OperatorHandle& op;
  torch::jit::Stack* stack;
  std::vector<TensorInput> tensors;  // in schema order, Tensor[] elements flattened
  const DeviceMesh* mesh = nullptr;  // the first DTensor's

  size_t num_args() const { return op.schema().arguments().size(); }
  const c10::IValue& arg(size_t i) const { return (*stack)[first_ + i]; }
  c10::IValue& arg(size_t i) { return (*stack)[first_ + i]; }
  // The TensorInput of schema argument `i` (plain Tensor argument), or null.
  const TensorInput* tensor_arg(size_t i) const;
  int64_t ndim_of(size_t i) const;  // ndim of tensor argument i
  // "self: [Shard(dim=0)], mat2: [Replicate()]"
  std::string describe() const;
  // Throws dtensor::Error "dtensor: <op> <why> (inputs: ...)".
  [[noreturn]] void fail(const std::string& why) const;

 private:
  size_t first_;
};

struct ShardingDecision {
  // For each entry of OpCall::tensors: the placements it must have before the op runs (nullopt: as it is;
  // plain scalars are always left as they are).
  std::vector<std::optional<Placements>> inputs;
  // For each output tensor (schema returns, Tensor[] returns flattened): its placements.
  std::vector<Placements> outputs;
  // Shape arguments given in global terms that the local op needs in local terms (view's size, expand's
  // size): argument index -> this rank's value. Decisions are cached per thread, i.e. per rank.
  std::vector<std::pair<int, std::vector<int64_t>>> local_int_lists;
  // The outputs' global shapes, for ops without a meta kernel in C++ (LibTorch lacks the Python-registered
  // ones): contiguous, with the first tensor input's dtype. Empty: learnt from a run on meta tensors.
  std::vector<std::vector<int64_t>> output_shapes;
};

using StrategyFn = ShardingDecision (*)(const OpCall& call);

// Placement helpers strategies use (defined with the placements, dtensor/tensor/placement.h).
using dtensor::reduce_partials;
using dtensor::replicate_all;

}  // namespace ops

// Registers a sharding strategy for an operator ("aten::cumsum", "mylib::my_op.overload"): from then on
// the op accepts DTensors, with inputs redistributed and outputs wrapped as the strategy decides. The op
// must have a meta kernel (or its outputs' global shapes are learnt from the first local run).
void register_sharding(const std::string& qualified_name, ops::StrategyFn strategy);

}  // namespace dtensor
