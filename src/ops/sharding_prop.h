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

#include "dtensor/tensor/dtensor_spec.h"
#include "ops/dispatch.h"

namespace dtensor::ops {

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
  std::string describe() const { return describe_inputs(op, *stack); }
  [[noreturn]] void fail(const std::string& why) const { ops::fail(op, *stack, why); }

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
};

using StrategyFn = ShardingDecision (*)(const OpCall& call);

// Registers `strategy` for the ops; they run through run_strategy.
void register_strategy(const std::vector<std::string>& qualified_names, StrategyFn strategy);
struct StrategyRegistration {
  StrategyRegistration(const std::vector<std::string>& names, StrategyFn strategy) { register_strategy(names, strategy); }
};
bool has_strategy(const std::string& qualified_name);

// The generic runner (steps 1-5 above).
void run_strategy(const c10::OperatorHandle& op, torch::jit::Stack* stack, StrategyFn strategy);

// Placement helpers for strategies.
Placements replicate_all(int64_t mesh_ndim);
// `p` with Partial entries replaced by Replicate (the reduction a non-linear op needs first).
Placements reduce_partials(Placements p);
// Cost in bytes of moving a tensor of `spec` to `target` on this rank (0 when equal); used to pick among
// candidate strategies.
int64_t redistribute_cost(const DTensorSpec& spec, const Placements& target);

// Statistics for tests and benchmarks.
struct DispatchStats {
  int64_t cache_hits = 0;
  int64_t cache_misses = 0;
};
DispatchStats& dispatch_stats();  // per thread

}  // namespace dtensor::ops
