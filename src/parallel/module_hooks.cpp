#include "dtensor/parallel/module_hooks.h"

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

#include "dtensor/parallel/layers.h"

namespace dtensor::nn {
namespace {

struct HookSet {
  std::weak_ptr<torch::nn::Module> owner;  // guards against a new module reusing a dead one's address
  std::vector<ForwardPreHookWithKwargs> pre;  // positional-only hooks are wrapped
  std::vector<ForwardHook> post;
  std::string path;
};

thread_local std::vector<std::string> path_stack;

// Pops the module path pushed for one forward, also when it throws.
struct PathScope {
  explicit PathScope(const std::string& path) : active(!path.empty()) {
    if (active) path_stack.push_back(path);
  }
  ~PathScope() {
    if (active) path_stack.pop_back();
  }
  bool active;
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
  if (alive.get() != &module) entry = HookSet{module.shared_from_this(), {}, {}, ""};
  return entry;
}

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
  auto it = table().find(&module);
  return it != table().end() && it->second.owner.lock().get() == &module &&
         (!it->second.pre.empty() || !it->second.post.empty());
}

at::Tensor call_with_hooks(torch::nn::Module& module, Tensors inputs, const std::function<at::Tensor(const Tensors&)>& body) {
  return call_with_hooks(module, std::move(inputs), Kwargs{}, [&](const Tensors& args, const Kwargs&) { return body(args); });
}

at::Tensor call_with_hooks(torch::nn::Module& module, Tensors inputs, Kwargs kwargs,
                           const std::function<at::Tensor(const Tensors&, const Kwargs&)>& body) {
  std::vector<ForwardPreHookWithKwargs> pre;
  std::vector<ForwardHook> post;
  std::string path;
  bool hooked = false;
  {
    // Copies the hooks out: the body (and the hooks) run without the lock, and may call submodules.
    std::lock_guard<std::mutex> lock(table_mutex());
    auto it = table().find(&module);
    if (it != table().end() && it->second.owner.lock().get() == &module) {
      hooked = true;
      pre = it->second.pre;
      post = it->second.post;
      path = it->second.path;
    }
  }
  if (!hooked) return body(inputs, kwargs);
  PathScope scope(path);
  for (auto& hook : pre) std::tie(inputs, kwargs) = hook(module, std::move(inputs), std::move(kwargs));
  at::Tensor out = body(inputs, kwargs);
  for (auto& hook : post) out = hook(module, inputs, std::move(out));
  return out;
}

void set_module_path(const torch::nn::Module& module, std::string path) {
  std::lock_guard<std::mutex> lock(table_mutex());
  hooks_of(const_cast<torch::nn::Module&>(module)).path = std::move(path);
}

std::string current_module_path() { return path_stack.empty() ? std::string() : path_stack.back(); }

void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  auto& params = module.*parameters_member();
  if (!params.contains(name)) {
    throw std::invalid_argument("dtensor: module " + module.name() + " has no parameter '" + name + "'");
  }
  params[name] = value;
  sync_member_handles(module, name, value);
}

void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  auto& buffers = module.*buffers_member();
  if (!buffers.contains(name)) {
    throw std::invalid_argument("dtensor: module " + module.name() + " has no buffer '" + name + "'");
  }
  buffers[name] = value;
}

}  // namespace dtensor::nn
