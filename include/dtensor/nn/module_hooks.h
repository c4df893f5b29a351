// Forward hooks for torch::nn::Module, which LibTorch lacks: the mechanism the parallel styles build on
// (through distribute_module). Model code does not call these, except for rule 2 below. Swapping a
// registered parameter for a DTensor is the other missing piece: dtensor/nn/parameter_replacement.h.
//
// The two rules a model author follows:
//   1. Use the layers of dtensor/nn/layers.h (dtensor::nn::Linear, Embedding, LayerNorm, RMSNorm,
//      Dropout: the same options and forward as torch::nn's) where a plan may apply a style. Containers
//      (Sequential, ModuleList, ModuleDict) and your own modules work as they are.
//   2. A module of your own that a plan targets directly (e.g. PrepareModuleInput on an attention block)
//      runs its forward body through dtensor::nn::call_with_hooks(*this, inputs, body). Inputs it wants
//      reachable by name (PrepareModuleInput's input_kwarg_layouts) go in the keyword map. An optional
//      input that is absent is an undefined tensor (or None in the general form).
//      A module that forgets this rule is caught when a styled submodule of it runs (link_enclosing_hooks).
//
// What hooks see. A forward's inputs and output are LibTorch's boxed values (c10::IValue, as in the
// dispatcher): a tensor, an int, a double, a bool, None, a string, a tuple or a list. PyTorch's hooks get
// whatever the forward got; so do ours. A style changes the tensors it has a layout for and passes every
// other value through as it came: an int head count, a bool `causal`, an absent optional mask, the second
// tensor of a (output, cache) tuple. Three spellings of one mechanism:
//   call_with_hooks(*this, {x}, body)                         Tensors in, one tensor out (the common layer)
//   call_with_hooks(*this, {x, mask}, {{"scale", s}}, body)    the same with keyword tensors
//   call_with_hooks<Output>(*this, Args{x, n_heads, true}, KwArgs{}, body)
//       the general form: any inputs; Output is what forward returns (at::Tensor,
//       std::tuple<at::Tensor, at::Tensor>, std::vector<at::Tensor>, ...), boxed for the hooks and unboxed
//       after them. call_with_hooks_boxed is the same without the typing.
//
// The hook table. Registration is rare (parallelize_module); a hooked forward is hot. Each hooked module's
// hooks are an immutable HookSet, and the table of them an immutable snapshot replaced whole on every
// change (under a writer lock). A forward reads its thread's cached snapshot: one atomic load of the
// table's generation, and no lock or reference count unless the table changed since that thread's last
// outermost hooked forward. An entry holds its module weakly: from the moment the module dies its entry is
// unreachable (a new module at the same address starts with no hooks), and it is dropped at the next change
// to the table (or prune_hook_table()), so the table stays as large as the set of live hooked modules.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::nn {

// The general form of a forward's inputs.
using Args = std::vector<c10::IValue>;                // positional inputs
using KwArgs = std::map<std::string, c10::IValue>;    // keyword inputs by name (PyTorch's forward kwargs)
// The tensor-only form, for the common forward whose inputs are all tensors.
using Tensors = std::vector<at::Tensor>;
using Kwargs = std::map<std::string, at::Tensor>;     // an undefined tensor is None

// Gets the module's inputs and returns the ones forward will see (PyTorch's
// register_forward_pre_hook(..., with_kwargs=True)).
using ForwardPreHook = std::function<std::pair<Args, KwArgs>(torch::nn::Module& module, Args args, KwArgs kwargs)>;
// Gets the positional inputs forward saw and its output, and returns the output the caller will see.
using ForwardHook = std::function<c10::IValue(torch::nn::Module& module, const Args& args, c10::IValue output)>;
// The tensor-only forms: for a module whose forward takes only tensors (None as an undefined tensor) and
// returns one tensor. Anything else reaching one is an error naming the module.
using TensorForwardPreHook = std::function<Tensors(torch::nn::Module& module, Tensors inputs)>;
using TensorForwardHook = std::function<at::Tensor(torch::nn::Module& module, const Tensors& inputs, at::Tensor output)>;

void register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook);
void register_forward_hook(torch::nn::Module& module, ForwardHook hook);
void register_forward_pre_hook(torch::nn::Module& module, TensorForwardPreHook hook);
void register_forward_hook(torch::nn::Module& module, TensorForwardHook hook);
bool has_hooks(const torch::nn::Module& module);

// Runs body(args, kwargs) with the module's pre-hooks before and hooks after (in registration order).
c10::IValue call_with_hooks_boxed(torch::nn::Module& module, Args args, KwArgs kwargs,
                                  const std::function<c10::IValue(const Args&, const KwArgs&)>& body);

// The general form, typed: Output is what the forward returns; any IValue-convertible type.
template <typename Output, typename Body>
Output call_with_hooks(torch::nn::Module& module, Args args, KwArgs kwargs, Body&& body) {
  c10::IValue out = call_with_hooks_boxed(module, std::move(args), std::move(kwargs),
                                          [&](const Args& a, const KwArgs& k) { return c10::IValue(body(a, k)); });
  return std::move(out).to<Output>();
}

// Tensors in, one tensor out: body(inputs).
at::Tensor call_with_hooks(torch::nn::Module& module, Tensors inputs, const std::function<at::Tensor(const Tensors&)>& body);
// The same for a forward with keyword inputs: body(args, kwargs).
at::Tensor call_with_hooks(torch::nn::Module& module, Tensors args, Kwargs kwargs,
                           const std::function<at::Tensor(const Tensors&, const Kwargs&)>& body);

// Records, for every hooked module under `root`, the hooked modules that enclose it. From then on a hooked
// module that runs while an enclosing hooked module's forward is not running raises an error naming both
// (that forward skipped call_with_hooks, rule 2, so its hooks never ran). parallelize_module calls it.
void link_enclosing_hooks(torch::nn::Module& root);

// Module paths for accounting (CommDebugMode): parallelize_module records the path of every module it
// touches; call_with_hooks keeps the innermost one on a per-thread stack while its forward runs.
void set_module_path(const torch::nn::Module& module, std::string path);
std::string current_module_path();  // "" outside any recorded module

// Drops the entries of modules that have died and returns how many entries remain (the live modules with
// hooks or a recorded path). Every change to the table does the same.
size_t prune_hook_table();

}  // namespace dtensor::nn
