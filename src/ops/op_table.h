// The one table of DTensor op rules, keyed by operator. An entry is either
//   - a sharding strategy (the common case): it decides input and output placements and run_strategy does
//     the rest (redistribute, run the same op on the local shards, wrap), or
//   - an explicitly declared custom handler, for ops whose local computation is not "the same op on the
//     shards": random ops (one global stream), item(), fills whose Partial terms differ per rank, the
//     loss-parallel kernels, vector norms (PyTorch's _NormPartial), the vocab-sharded embedding lookup
//     (PyTorch's _MaskPartial). A custom handler may still hand the common case to run_strategy.
// The DTensor dispatch key has one boxed kernel for every op in the table: it finds the entry (a per-thread
// pointer cache; entries live for the process) and reads its rule atomically, so replacing a rule after
// first use takes effect on every thread, and the decision caches drop what they learnt (rules_generation).
// Every name is checked against the dispatcher's schemas at registration: a misspelt op fails loudly.
// Internal header.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/ops/sharding_strategy.h"

namespace dtensor::ops {

// A custom handler finds the op's inputs on the stack and must leave its outputs there, as a boxed kernel.
using OpHandler = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// "aten::add.Tensor", "aten::detach", "mylib::my_op.overload". Throws dtensor::Error when a name does not
// resolve to a registered operator schema.
void register_strategy(const std::vector<std::string>& qualified_names, StrategyFn strategy);
void register_custom_handler(const std::string& qualified_name, OpHandler handler);

// Registration at static-initialisation time, named after what it registers:
//   const StrategyRegistration matmul_rules({"aten::mm"}, &mm_strategy);
//   const CustomHandlerRegistration random_rules[] = {{"aten::uniform_", &random_in_place}, ...};
struct StrategyRegistration {
  StrategyRegistration(const std::vector<std::string>& names, StrategyFn strategy) { register_strategy(names, strategy); }
};
struct CustomHandlerRegistration {
  CustomHandlerRegistration(const std::string& name, OpHandler handler) { register_custom_handler(name, handler); }
};

// The operators in the table, sorted.
std::vector<std::string> registered_ops();
bool has_rule(const std::string& qualified_name);

// Bumped whenever a rule is replaced: decision caches filled before it are stale.
uint64_t rules_generation();

}  // namespace dtensor::ops
