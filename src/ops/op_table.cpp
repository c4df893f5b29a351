#include "ops/op_table.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "dtensor/core/error.h"
#include "dtensor/ops/dispatch_options.h"
#include "ops/op_call.h"
#include "ops/run_strategy.h"
#include "tensor/dtensor_impl.h"

namespace dtensor::ops {
namespace {

// One operator's rule. Entries are never freed (the boxed kernel's per-thread caches point at them); a
// rule is replaced by storing into the atomics.
struct OpEntry {
  std::atomic<StrategyFn> strategy{nullptr};
  std::atomic<OpHandler> custom{nullptr};
};

struct Table {
  std::mutex mutex;  // registration only; the hot path reads entries without it
  std::unordered_map<std::string, std::unique_ptr<OpEntry>> entries;
  std::map<std::string, std::unique_ptr<torch::Library>> libraries;  // per namespace, impls on the DTensor key
  std::unordered_set<std::string> with_kernel;  // ops whose DTensor-key kernel is boxed_kernel
  std::atomic<uint64_t> generation{0};
};

Table& table() {
  static Table t;
  return t;
}

OpEntry* find_entry(const std::string& name) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.entries.find(name);
  return it == t.entries.end() ? nullptr : it->second.get();
}

void boxed_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Hot path: the entry by schema address (stable for the process) from a per-thread cache; a miss (first
  // call on this thread, or an op without a rule yet) asks the table under its lock.
  thread_local std::unordered_map<const void*, const OpEntry*> cache;
  const void* key = &op.schema();
  auto it = cache.find(key);
  const OpEntry* entry = it != cache.end() ? it->second : nullptr;
  if (!entry) {
    entry = find_entry(op_name(op));
    if (!entry) fail(op, *stack, "has no sharding rule for DTensor inputs");
    cache.emplace(key, entry);
  }
  if (OpHandler custom = entry->custom.load(std::memory_order_acquire)) return custom(op, stack);
  run_strategy(op, stack, entry->strategy.load(std::memory_order_acquire));
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fail(op, *stack, "is not supported on DTensors yet (no sharding rule)");
}

// Puts boxed_kernel on the DTensor key for `qualified_name` ("ns::op.overload") once. Caller holds the lock.
void install_kernel(Table& t, const std::string& qualified_name) {
  if (!t.with_kernel.insert(qualified_name).second) return;
  auto sep = qualified_name.find("::");
  std::string ns = qualified_name.substr(0, sep);
  auto& library = t.libraries[ns];
  if (!library) library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, detail::kDTensorKey, __FILE__, __LINE__);
  library->impl(qualified_name.substr(sep + 2).c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed_kernel>());
}

// Checks the name against the dispatcher's schemas ("aten::add.Tensor": name "aten::add", overload "Tensor").
void check_schema_exists(const std::string& qualified_name) {
  DTENSOR_CHECK(qualified_name.find("::") != std::string::npos,
                "dtensor: expected a qualified op name like aten::add.Tensor, got '", qualified_name, "'");
  auto dot = qualified_name.find('.', qualified_name.find("::"));
  std::string name = qualified_name.substr(0, dot);
  std::string overload = dot == std::string::npos ? "" : qualified_name.substr(dot + 1);
  DTENSOR_CHECK(c10::Dispatcher::singleton().findSchema({name, overload}),
                "dtensor: cannot register a sharding rule for '", qualified_name,
                "': no operator schema of that name and overload is registered (check the spelling, and "
                "that the library defining a custom op is loaded first)");
}

// Registers `name` with one of strategy / custom set (the other cleared).
void set_rule(const std::string& name, StrategyFn strategy, OpHandler custom) {
  check_schema_exists(name);
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto& slot = t.entries[name];
  const bool replacing = slot != nullptr;
  if (!slot) slot = std::make_unique<OpEntry>();
  slot->strategy.store(strategy, std::memory_order_release);
  slot->custom.store(custom, std::memory_order_release);
  if (replacing) t.generation.fetch_add(1, std::memory_order_acq_rel);
  install_kernel(t, name);
}

// Ops with a CompositeExplicitAutograd(NonFunctional) kernel run that kernel for every backend key that has
// none of its own, so the fallback never sees them: they would reach the wrapper's missing storage or
// return plain tensors of the global shape. Give each our kernel; without a rule it raises the op's name
// and placements. (CompositeImplicitAutograd ops are left alone: they decompose.) Runs once, when the
// library loads: LibTorch's operators are registered by then (libdtensor depends on libtorch), and the
// order against our own registrations does not matter (the kernel is the same; the table decides).
bool cover_composite_ops() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    install_kernel(t, name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
  }
  return true;
}
const bool composite_ops_covered = cover_composite_ops();

}  // namespace

void register_strategy(const std::vector<std::string>& qualified_names, StrategyFn strategy) {
  DTENSOR_CHECK(strategy, "dtensor: register_strategy got a null strategy");
  for (const auto& name : qualified_names) set_rule(name, strategy, nullptr);
}

void register_custom_handler(const std::string& qualified_name, OpHandler handler) {
  DTENSOR_CHECK(handler, "dtensor: register_custom_handler got a null handler");
  set_rule(qualified_name, nullptr, handler);
}

std::vector<std::string> registered_ops() {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::string> names;
  for (const auto& [name, _] : t.entries) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

bool has_rule(const std::string& qualified_name) { return find_entry(qualified_name) != nullptr; }

uint64_t rules_generation() { return table().generation.load(std::memory_order_acquire); }

}  // namespace dtensor::ops

std::vector<std::string> dtensor::supported_ops() { return ops::registered_ops(); }

void dtensor::register_sharding(const std::string& qualified_name, ops::StrategyFn strategy) {
  ops::register_strategy({qualified_name}, strategy);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&dtensor::ops::fallback>());
}
