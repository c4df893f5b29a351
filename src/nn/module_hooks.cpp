#include "dtensor/nn/module_hooks.h"
#include "dtensor/mesh/comm_hooks.h"
#include "nn/forward_override.h"
#include "dtensor/core/error.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>

namespace dtensor::nn {
namespace {

// A hooked module that encloses another hooked one: its forward must be running whenever the inner one runs.
struct Enclosing {
  std::weak_ptr<torch::nn::Module> module;
  const torch::nn::Module* address;  // compared with the running stack; valid while `module` lives
  std::string path;
};

// One module's hooks. Immutable once in the table: a change builds a new HookSet.
struct HookSet {
  std::weak_ptr<torch::nn::Module> owner;  // the entry is this module's only while it lives
  const torch::nn::Module* address = nullptr;
  std::vector<ForwardPreHook> pre;
  std::vector<ForwardHook> post;
  std::vector<detail::ForwardOverride> overrides;
  std::vector<detail::ForwardWrapper> wrappers;  // at most one (register_forward_wrapper)
  std::string path;
  std::vector<Enclosing> enclosing;
  bool any_hooks() const { return !pre.empty() || !post.empty() || !overrides.empty() || !wrappers.empty(); }
};
using HookSetPtr = std::shared_ptr<const HookSet>;
using Table = std::unordered_map<const torch::nn::Module*, HookSetPtr>;

// The published table and its generation; writers hold the mutex.
std::mutex& writer_mutex() {
  static std::mutex m;
  return m;
}
std::shared_ptr<const Table>& published() {  // guarded by writer_mutex
  static std::shared_ptr<const Table> t = std::make_shared<const Table>();
  return t;
}
std::atomic<uint64_t> generation{1};

// The hooked forwards running on this thread, innermost last.
thread_local std::vector<const HookSet*> running;

// This thread's copy of the table. It is refreshed only between outermost hooked forwards, so the
// HookSets of the running forwards (pointed to by `running`) stay alive while they run.
struct CachedTable {
  uint64_t generation = 0;
  std::shared_ptr<const Table> table;
};
thread_local CachedTable cached;

// The entry at `module`'s address if it is this live module's (not a dead one's that had the address).
const HookSet* find_live(const Table& table, const torch::nn::Module& module) {
  auto it = table.find(&module);
  // A live owner at this address is this module: two live objects cannot share an address.
  return it != table.end() && !it->second->owner.expired() ? it->second.get() : nullptr;
}

// The hot path: no lock unless the table changed since this thread last looked.
const HookSet* live_hooks_fast(const torch::nn::Module& module) {
  const uint64_t g = generation.load(std::memory_order_acquire);
  if (cached.generation != g && running.empty()) {
    std::lock_guard<std::mutex> lock(writer_mutex());
    cached.table = published();
    cached.generation = generation.load(std::memory_order_relaxed);
  }
  return cached.table ? find_live(*cached.table, module) : nullptr;
}

// Applies `change` to a copy of the table (without the entries of dead modules) and publishes it.
// `change` returns false when it changed nothing.
template <typename Change>
void modify_table(Change change) {
  std::lock_guard<std::mutex> lock(writer_mutex());
  auto next = std::make_shared<Table>();
  for (const auto& [address, hooks] : *published()) {
    if (!hooks->owner.expired()) next->emplace(address, hooks);
  }
  const bool pruned = next->size() != published()->size();
  if (!change(*next) && !pruned) return;
  published() = std::move(next);
  generation.fetch_add(1, std::memory_order_release);
}

// A copy of `module`'s entry in `table` to change (a fresh one if it has none or a dead module's).
HookSet editable(const Table& table, torch::nn::Module& module) {
  if (const HookSet* live = find_live(table, module)) return *live;
  HookSet fresh;
  fresh.owner = module.shared_from_this();
  fresh.address = &module;
  return fresh;
}

template <typename Edit>
void edit_hooks(torch::nn::Module& module, Edit edit) {
  modify_table([&](Table& table) {
    HookSet hooks = editable(table, module);
    edit(hooks);
    table[&module] = std::make_shared<const HookSet>(std::move(hooks));
    return true;
  });
}

// Keeps the running stack right, also when a hook or the body throws.
struct RunningScope {
  explicit RunningScope(const HookSet* hooks) { running.push_back(hooks); }
  ~RunningScope() { running.pop_back(); }
};

// A style's hooks on an enclosing module are skipped when its forward does not go through
// call_with_hooks: its inputs would silently arrive unprepared here. Refuse instead.
void check_enclosing_running(const torch::nn::Module& module, const HookSet& hooks) {
  for (const auto& outer : hooks.enclosing) {
    if (outer.module.expired()) continue;
    auto is_outer = [&](const HookSet* h) { return h->address == outer.address; };
    if (std::any_of(running.begin(), running.end(), is_outer)) continue;
    auto alive = outer.module.lock();
    if (!alive) continue;
    throw DTENSOR_ERROR("dtensor: '", (hooks.path.empty() ? module.name() : hooks.path),
                        "' ran outside the forward of '", outer.path, "', which has parallel-style hooks: ",
                        alive->name(),
                        "::forward must run its body through dtensor::nn::call_with_hooks (rule 2 in "
                        "dtensor/nn/module_hooks.h), or its hooks never run");
  }
}

// The tensor-only forms' view of boxed inputs: tensors, and None as an undefined tensor.
Tensors unbox_tensors(const Args& args, const torch::nn::Module& module) {
  Tensors out;
  out.reserve(args.size());
  for (size_t k = 0; k < args.size(); ++k) {
    if (args[k].isTensor()) {
      out.push_back(args[k].toTensor());
    } else if (args[k].isNone()) {
      out.emplace_back();
    } else {
      throw DTENSOR_ERROR("dtensor: a tensor-only hook or forward of ", module.name(), " got input ", k, " of type ",
                          args[k].tagKind(), "; use the general form (nn::Args, nn::ForwardPreHook)");
    }
  }
  return out;
}

Args box(const Tensors& tensors) { return Args(tensors.begin(), tensors.end()); }

KwArgs box(const Kwargs& kwargs) {
  KwArgs out;
  for (const auto& [name, t] : kwargs) out.emplace(name, t);
  return out;
}

Kwargs unbox_kwargs(const KwArgs& kwargs, const torch::nn::Module& module) {
  Kwargs out;
  for (const auto& [name, v] : kwargs) {
    DTENSOR_CHECK(v.isTensor() || v.isNone(), "dtensor: a tensor-only forward of ", module.name(),
                  " got keyword input '", name, "' of type ", v.tagKind());
    out.emplace(name, v.isTensor() ? v.toTensor() : at::Tensor());
  }
  return out;
}

at::Tensor unbox_output(const c10::IValue& out, const torch::nn::Module& module) {
  DTENSOR_CHECK(out.isTensor(), "dtensor: a tensor-only hook or forward of ", module.name(), " got an output of type ",
                out.tagKind(), "; use the general form (call_with_hooks<Output>, nn::ForwardHook)");
  return out.toTensor();
}

}  // namespace

void register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook) {
  edit_hooks(module, [&](HookSet& hooks) { hooks.pre.push_back(std::move(hook)); });
}

void register_forward_hook(torch::nn::Module& module, ForwardHook hook) {
  edit_hooks(module, [&](HookSet& hooks) { hooks.post.push_back(std::move(hook)); });
}

void register_forward_pre_hook(torch::nn::Module& module, TensorForwardPreHook hook) {
  register_forward_pre_hook(module, ForwardPreHook([hook = std::move(hook)](torch::nn::Module& m, Args args, KwArgs kwargs) {
    return std::make_pair(box(hook(m, unbox_tensors(args, m))), std::move(kwargs));
  }));
}

void register_forward_hook(torch::nn::Module& module, TensorForwardHook hook) {
  register_forward_hook(module, ForwardHook([hook = std::move(hook)](torch::nn::Module& m, const Args& args, c10::IValue out) {
    return c10::IValue(hook(m, unbox_tensors(args, m), unbox_output(out, m)));
  }));
}

namespace detail {

void register_forward_pre_hook_first(torch::nn::Module& module, ForwardPreHook hook) {
  edit_hooks(module, [&](HookSet& hooks) { hooks.pre.insert(hooks.pre.begin(), std::move(hook)); });
}

void register_forward_override(torch::nn::Module& module, ForwardOverride override_body) {
  edit_hooks(module, [&](HookSet& hooks) { hooks.overrides.push_back(std::move(override_body)); });
}

bool has_forward_override(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(writer_mutex());
  const HookSet* hooks = find_live(*published(), module);
  return hooks && !hooks->overrides.empty();
}

void register_forward_wrapper(torch::nn::Module& module, ForwardWrapper wrapper) {
  edit_hooks(module, [&](HookSet& hooks) {
    DTENSOR_CHECK(hooks.wrappers.empty(), "dtensor: module '", hooks.path.empty() ? module.name() : hooks.path,
                  "' already has a forward wrapper (checkpoint_wrapper applied twice?)");
    hooks.wrappers.push_back(std::move(wrapper));
  });
}

bool has_forward_wrapper(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(writer_mutex());
  const HookSet* hooks = find_live(*published(), module);
  return hooks && !hooks->wrappers.empty();
}

}  // namespace detail

bool has_hooks(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(writer_mutex());
  const HookSet* hooks = find_live(*published(), module);
  return hooks && hooks->any_hooks();
}

namespace {

// The hooked forward: pre-hooks, body, hooks, with the module on the running stack.
c10::IValue run_hooked(torch::nn::Module& module, const HookSet& hooks, Args args, KwArgs kwargs,
                       const std::function<c10::IValue(const Args&, const KwArgs&)>& body) {
  check_enclosing_running(module, hooks);
  RunningScope scope(&hooks);
  // Collectives issued in here (and, through autograd_collectives, in their backward) count for this path.
  std::optional<CommScopeGuard> comm_scope;
  if (!hooks.path.empty()) comm_scope.emplace(hooks.path);
  for (const auto& hook : hooks.pre) std::tie(args, kwargs) = hook(module, std::move(args), std::move(kwargs));
  std::optional<c10::IValue> replaced;
  for (const auto& override_body : hooks.overrides) {
    if ((replaced = override_body(module, args, kwargs))) break;
  }
  c10::IValue out = replaced                  ? std::move(*replaced)
                    : hooks.wrappers.empty() ? body(args, kwargs)
                                             : hooks.wrappers.front()(module, args, kwargs, body);
  for (const auto& hook : hooks.post) out = hook(module, args, std::move(out));
  return out;
}

}  // namespace

c10::IValue call_with_hooks_boxed(torch::nn::Module& module, Args args, KwArgs kwargs,
                                  const std::function<c10::IValue(const Args&, const KwArgs&)>& body) {
  const HookSet* hooks = live_hooks_fast(module);
  if (!hooks) return body(args, kwargs);
  return run_hooked(module, *hooks, std::move(args), std::move(kwargs), body);
}

// The tensor-only forms: an unhooked module (the common case) runs its body with no boxing.
at::Tensor call_with_hooks(torch::nn::Module& module, Tensors inputs, const std::function<at::Tensor(const Tensors&)>& body) {
  const HookSet* hooks = live_hooks_fast(module);
  if (!hooks) return body(inputs);
  // Holds the body and the module, nothing of this frame: a forward wrapper may keep it (forward_override.h).
  auto boxed_body = [body, m = &module](const Args& args, const KwArgs&) { return c10::IValue(body(unbox_tensors(args, *m))); };
  return unbox_output(run_hooked(module, *hooks, box(inputs), {}, boxed_body), module);
}

at::Tensor call_with_hooks(torch::nn::Module& module, Tensors args, Kwargs kwargs,
                           const std::function<at::Tensor(const Tensors&, const Kwargs&)>& body) {
  const HookSet* hooks = live_hooks_fast(module);
  if (!hooks) return body(args, kwargs);
  auto boxed_body = [body, m = &module](const Args& a, const KwArgs& k) {
    return c10::IValue(body(unbox_tensors(a, *m), unbox_kwargs(k, *m)));
  };
  return unbox_output(run_hooked(module, *hooks, box(args), box(kwargs), boxed_body), module);
}

void set_module_path(const torch::nn::Module& module, std::string path) {
  edit_hooks(const_cast<torch::nn::Module&>(module), [&](HookSet& hooks) { hooks.path = std::move(path); });
}

std::string current_module_path() {
  for (auto it = running.rbegin(); it != running.rend(); ++it) {
    if (!(*it)->path.empty()) return (*it)->path;
  }
  return "";
}

void link_enclosing_hooks(torch::nn::Module& root) {
  modify_table([&](Table& table) {
    auto hooked = [&](const std::shared_ptr<torch::nn::Module>& m) {
      const HookSet* hooks = find_live(table, *m);
      return hooks && hooks->any_hooks();
    };
    bool changed = false;
    for (const auto& outer : root.named_modules("", /*include_self=*/true)) {
      if (!hooked(outer.value())) continue;
      for (const auto& inner : outer.value()->named_modules("", /*include_self=*/false)) {
        if (!hooked(inner.value())) continue;
        const HookSet& current = *table[inner.value().get()];
        auto same = [&](const Enclosing& e) { return e.address == outer.value().get() && !e.module.expired(); };
        if (std::any_of(current.enclosing.begin(), current.enclosing.end(), same)) continue;
        HookSet next = current;
        next.enclosing.push_back({outer.value(), outer.value().get(),
                                  outer.key().empty() ? std::string("(the root module)") : outer.key()});
        table[inner.value().get()] = std::make_shared<const HookSet>(std::move(next));
        changed = true;
      }
    }
    return changed;
  });
}

size_t prune_hook_table() {
  modify_table([](Table&) { return false; });
  std::lock_guard<std::mutex> lock(writer_mutex());
  return published()->size();
}

}  // namespace dtensor::nn
