#include "ops/dispatch.h"
#include "dtensor/error.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "dtensor/ops/dispatch_options.h"
#include "dtensor/tensor/dtensor.h"
#include "tensor/dtensor_impl.h"

namespace dtensor::ops {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, OpHandler> handlers;
  std::unordered_set<std::string> with_kernel;  // ops whose DTensor-key kernel is boxed_kernel
  std::map<std::string, std::unique_ptr<torch::Library>> libraries;  // per namespace, impls on the DTensor key
  bool swept = false;
};

Registry& registry() {
  static Registry r;
  return r;
}

void boxed_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Hot path: look the handler up by schema address (stable for the process) in a per-thread cache.
  thread_local std::unordered_map<const void*, OpHandler> cache;
  const void* key = &op.schema();
  auto it = cache.find(key);
  if (it == cache.end()) {
    OpHandler handler = nullptr;
    {
      auto& r = registry();
      std::lock_guard<std::mutex> lock(r.mutex);
      auto found = r.handlers.find(op_name(op));
      if (found != r.handlers.end()) handler = found->second;
    }
    if (!handler) fail(op, *stack, "has no sharding rule for DTensor inputs");
    it = cache.emplace(key, handler).first;
  }
  it->second(op, stack);
}

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fail(op, *stack, "is not supported on DTensors yet (no sharding rule)");
}

}  // namespace

namespace {
// Puts boxed_kernel on the DTensor key for `qualified_name` ("ns::op.overload") once. Caller holds the
// registry lock.
void install_kernel(Registry& r, const std::string& qualified_name) {
  if (!r.with_kernel.insert(qualified_name).second) return;
  auto sep = qualified_name.find("::");
  std::string ns = qualified_name.substr(0, sep);
  auto& library = r.libraries[ns];
  if (!library) library = std::make_unique<torch::Library>(torch::Library::IMPL, ns, detail::kDTensorKey, __FILE__, __LINE__);
  library->impl(qualified_name.substr(sep + 2).c_str(), torch::CppFunction::makeFromBoxedFunction<&boxed_kernel>());
}
}  // namespace

void register_op(const std::string& qualified_name, OpHandler handler) {
  if (qualified_name.find("::") == std::string::npos) {
    throw dtensor::Error("dtensor: expected a qualified op name like aten::add.Tensor, got " + qualified_name);
  }
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.handlers[qualified_name] = handler;
  install_kernel(r, qualified_name);
}

void ensure_composite_ops_covered() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.swept) return;
  r.swept = true;
  // Ops with a CompositeExplicitAutograd(NonFunctional) kernel run that kernel for every backend key that
  // has none of its own, so the fallback never sees them: they would reach the wrapper's missing storage
  // or return plain tensors of the global shape. Give each our kernel; without a handler it raises the
  // op's name and placements. (CompositeImplicitAutograd ops are left alone: they decompose.)
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
    if (op->hasKernelForDispatchKey(detail::kDTensorKey)) continue;
    install_kernel(r, name.overload_name.empty() ? name.name : name.name + "." + name.overload_name);
  }
}

}  // namespace dtensor::ops

std::vector<std::string> dtensor::supported_ops() { return ops::registered_ops(); }

namespace dtensor::ops {

std::vector<std::string> registered_ops() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, _] : r.handlers) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

std::string op_name(const c10::OperatorHandle& op) {
  const auto& name = op.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

std::string describe_inputs(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& args = op.schema().arguments();
  auto inputs = torch::jit::last(stack, args.size());
  std::ostringstream os;
  bool first = true;
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = inputs[i];
    auto describe = [&](const at::Tensor& t, const std::string& name) {
      os << (first ? "" : ", ") << name << ": ";
      first = false;
      if (is_dtensor(t)) os << to_string(dtensor_spec(t).placements);
      else if (t.defined()) os << "plain tensor " << t.sizes();
      else os << "undefined";
    };
    if (v.isTensor()) {
      describe(v.toTensor(), args[i].name());
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      for (size_t k = 0; k < list.size(); ++k) describe(list.get(k), args[i].name() + "[" + std::to_string(k) + "]");
    }
  }
  return os.str();
}

void fail(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const std::string& why) {
  throw dtensor::Error("dtensor: " + op_name(op) + " " + why + " (inputs: " + describe_inputs(op, stack) + ")");
}

int first_dtensor_input(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  size_t n = op.schema().arguments().size();
  auto inputs = torch::jit::last(stack, n);
  for (size_t i = 0; i < n; ++i) {
    if (inputs[i].isTensor() && is_dtensor(inputs[i].toTensor())) return static_cast<int>(i);
  }
  return -1;
}

void call_local(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::vector<at::Tensor>* locals) {
  size_t n = op.schema().arguments().size();
  size_t next = 0;
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (!v.isTensor() || !is_dtensor(v.toTensor())) continue;
    v = locals ? (*locals).at(next++) : detail::local_tensor(v.toTensor());
  }
  // Locals never record autograd history: the DTensor wrapper carries it.
  at::AutoDispatchBelowADInplaceOrView guard;
  op.callBoxed(stack);
}

}  // namespace dtensor::ops

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&dtensor::ops::fallback>());
}
