#include "dtensor/parallel/module_hooks.h"
#include "dtensor/error.h"

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "dtensor/parallel/layers.h"

namespace dtensor::nn {
namespace {

// A hooked module that encloses another hooked one: its forward must be running whenever the inner one runs.
struct Enclosing {
  std::weak_ptr<torch::nn::Module> module;
  std::string path;
};

struct HookSet {
  std::weak_ptr<torch::nn::Module> owner;  // guards against a new module reusing a dead one's address
  std::vector<ForwardPreHookWithKwargs> pre;  // positional-only hooks are wrapped
  std::vector<ForwardHook> post;
  std::string path;
  std::vector<Enclosing> enclosing;
};

// The hooked modules whose forward is running on this thread, innermost last, and their paths.
thread_local std::vector<const torch::nn::Module*> running;
thread_local std::vector<std::string> path_stack;

// Pushes one hooked forward and pops it, also when it throws.
struct RunningScope {
  RunningScope(const torch::nn::Module* module, const std::string& path) : has_path(!path.empty()) {
    running.push_back(module);
    if (has_path) path_stack.push_back(path);
  }
  ~RunningScope() {
    running.pop_back();
    if (has_path) path_stack.pop_back();
  }
  bool has_path;
};

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}
std::unordered_map<const torch::nn::Module*, HookSet>& table() {
  static std::unordered_map<const torch::nn::Module*, HookSet> t;
  return t;
}

HookSet& hooks_of(torch::nn::Module& module) {
  auto& entry = table()[&module];
  auto alive = entry.owner.lock();
  if (alive.get() != &module) {
    entry = HookSet{};
    entry.owner = module.shared_from_this();
  }
  return entry;
}

// The module's hooks, if the entry at its address is this live module's (not a dead one's). Lock held.
const HookSet* live_hooks(const torch::nn::Module& module) {
  auto it = table().find(&module);
  return it != table().end() && it->second.owner.lock().get() == &module ? &it->second : nullptr;
}

bool any_hooks(const HookSet* hooks) { return hooks && (!hooks->pre.empty() || !hooks->post.empty()); }

// torch::nn::Module keeps parameters_ protected and buffers_ private, and register_parameter /
// register_buffer refuse existing names. An explicit template instantiation may name private members (the
// standard exempts its arguments from access checking): these accessors hand out pointers to the two maps.
using TensorDict = torch::OrderedDict<std::string, at::Tensor>;
TensorDict torch::nn::Module::*parameters_member();
TensorDict torch::nn::Module::*buffers_member();
template <TensorDict torch::nn::Module::*Member>
struct ParametersAccess {
  friend TensorDict torch::nn::Module::*parameters_member() { return Member; }
};
template <TensorDict torch::nn::Module::*Member>
struct BuffersAccess {
  friend TensorDict torch::nn::Module::*buffers_member() { return Member; }
};
template struct ParametersAccess<&torch::nn::Module::parameters_>;
template struct BuffersAccess<&torch::nn::Module::buffers_>;

void sync_member_handles(torch::nn::Module& module, const std::string& name, const at::Tensor& value) {
  auto set = [&](at::Tensor& member, const char* member_name) {
    if (name == member_name) member = value;
  };
  if (auto* m = dynamic_cast<torch::nn::LinearImpl*>(&module)) {
    set(m->weight, "weight");
    set(m->bias, "bias");
  } else if (auto* m = dynamic_cast<torch::nn::EmbeddingImpl*>(&module)) {
    set(m->weight, "weight");
  } else if (auto* m = dynamic_cast<torch::nn::LayerNormImpl*>(&module)) {
    set(m->weight, "weight");
    set(m->bias, "bias");
  } else if (auto* m = dynamic_cast<RMSNormImpl*>(&module)) {
    set(m->weight, "weight");
  }
}

}  // namespace

void register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook) {
  register_forward_pre_hook_with_kwargs(module, [hook = std::move(hook)](torch::nn::Module& m, Tensors args, Kwargs kwargs) {
    return std::make_pair(hook(m, std::move(args)), std::move(kwargs));
  });
}

void register_forward_pre_hook_with_kwargs(torch::nn::Module& module, ForwardPreHookWithKwargs hook) {
  std::lock_guard<std::mutex> lock(table_mutex());
  hooks_of(module).pre.push_back(std::move(hook));
}

void register_forward_hook(torch::nn::Module& module, ForwardHook hook) {
  std::lock_guard<std::mutex> lock(table_mutex());
  hooks_of(module).post.push_back(std::move(hook));
}

bool has_hooks(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(table_mutex());
  return any_hooks(live_hooks(module));
}

at::Tensor call_with_hooks(torch::nn::Module& module, Tensors inputs, const std::function<at::Tensor(const Tensors&)>& body) {
  return call_with_hooks(module, std::move(inputs), Kwargs{}, [&](const Tensors& args, const Kwargs&) { return body(args); });
}

at::Tensor call_with_hooks(torch::nn::Module& module, Tensors inputs, Kwargs kwargs,
                           const std::function<at::Tensor(const Tensors&, const Kwargs&)>& body) {
  std::optional<HookSet> hooks;
  {
    // Copies the hooks out: the body (and the hooks) run without the lock, and may call submodules.
    std::lock_guard<std::mutex> lock(table_mutex());
    if (const HookSet* live = live_hooks(module)) hooks = *live;
  }
  if (!hooks) return body(inputs, kwargs);
  const std::string& path = hooks->path;
  // A style's hooks on an enclosing module are skipped when its forward does not go through
  // call_with_hooks: its inputs would silently arrive unprepared here. Refuse instead.
  for (const auto& outer : hooks->enclosing) {
    auto alive = outer.module.lock();
    if (!alive || std::find(running.begin(), running.end(), alive.get()) != running.end()) continue;
    throw dtensor::Error("dtensor: '" + (path.empty() ? module.name() : path) + "' ran outside the forward of '" + outer.path +
                           "', which has parallel-style hooks: " + alive->name() +
                           "::forward must run its body through dtensor::nn::call_with_hooks (rule 2 in "
                           "dtensor/parallel/module_hooks.h), or its hooks never run");
  }
  RunningScope scope(&module, path);
  for (auto& hook : hooks->pre) std::tie(inputs, kwargs) = hook(module, std::move(inputs), std::move(kwargs));
  at::Tensor out = body(inputs, kwargs);
  for (auto& hook : hooks->post) out = hook(module, inputs, std::move(out));
  return out;
}

void set_module_path(const torch::nn::Module& module, std::string path) {
  std::lock_guard<std::mutex> lock(table_mutex());
  hooks_of(const_cast<torch::nn::Module&>(module)).path = std::move(path);
}

void link_enclosing_hooks(torch::nn::Module& root) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto hooked = [](const std::shared_ptr<torch::nn::Module>& m) { return any_hooks(live_hooks(*m)); };
  for (const auto& outer : root.named_modules("", /*include_self=*/true)) {
    if (!hooked(outer.value())) continue;
    for (const auto& inner : outer.value()->named_modules("", /*include_self=*/false)) {
      if (!hooked(inner.value())) continue;
      auto& list = table()[inner.value().get()].enclosing;
      bool known = false;
      for (const auto& e : list) known = known || e.module.lock() == outer.value();
      if (!known) list.push_back({outer.value(), outer.key().empty() ? std::string("(the root module)") : outer.key()});
    }
  }
}

std::string current_module_path() { return path_stack.empty() ? std::string() : path_stack.back(); }

void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  auto& params = module.*parameters_member();
  if (!params.contains(name)) {
    throw dtensor::Error("dtensor: module " + module.name() + " has no parameter '" + name + "'");
  }
  params[name] = value;
  sync_member_handles(module, name, value);
}

void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  auto& buffers = module.*buffers_member();
  if (!buffers.contains(name)) {
    throw dtensor::Error("dtensor: module " + module.name() + " has no buffer '" + name + "'");
  }
  buffers[name] = value;
}

}  // namespace dtensor::nn
