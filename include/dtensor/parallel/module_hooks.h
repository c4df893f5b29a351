// What LibTorch's torch::nn::Module lacks for tensor parallelism: forward hooks and parameter
// replacement. The parallel styles use these; model code does not.
//
// The two rules a model author follows:
//   1. Use the layers of dtensor/parallel/layers.h (dtensor::nn::Linear, Embedding, LayerNorm, RMSNorm,
//      Dropout: the same options and forward as torch::nn's) where a plan may apply a style. Containers
//      (Sequential, ModuleList, ModuleDict) and your own modules work as they are.
//   2. A module of your own that a plan targets directly (e.g. PrepareModuleInput on an attention block)
//      runs its forward body through dtensor::nn::call_with_hooks(*this, inputs, body). Inputs it wants
//      reachable by name (PrepareModuleInput's input_kwarg_layouts) go in the Kwargs of
//      call_with_hooks(*this, args, kwargs, body). An optional input that is absent is an undefined tensor.
//      A module that forgets this rule is caught when a styled submodule of it runs (link_enclosing_hooks).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::nn {

using Tensors = std::vector<at::Tensor>;
// Keyword inputs by name (PyTorch's forward kwargs); an undefined tensor is None.
using Kwargs = std::map<std::string, at::Tensor>;
// Gets the module's positional inputs and returns the ones forward will see.
using ForwardPreHook = std::function<Tensors(torch::nn::Module& module, Tensors inputs)>;
// The same with the keyword inputs (PyTorch's register_forward_pre_hook(..., with_kwargs=True)).
using ForwardPreHookWithKwargs =
    std::function<std::pair<Tensors, Kwargs>(torch::nn::Module& module, Tensors args, Kwargs kwargs)>;
// Gets the inputs forward saw and its output, and returns the output the caller will see.
using ForwardHook = std::function<at::Tensor(torch::nn::Module& module, const Tensors& inputs, at::Tensor output)>;

void register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook);
void register_forward_pre_hook_with_kwargs(torch::nn::Module& module, ForwardPreHookWithKwargs hook);
void register_forward_hook(torch::nn::Module& module, ForwardHook hook);
bool has_hooks(const torch::nn::Module& module);

// Runs body(inputs) with the module's pre-hooks before and hooks after (in registration order).
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

// Replaces the parameter (or buffer) `name` registered directly on `module` (LibTorch's
// register_parameter refuses an existing name) and the member handle of the standard layers that cache it
// (Linear, Embedding, LayerNorm, RMSNorm: weight, bias).
void replace_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value);
void replace_buffer(torch::nn::Module& module, const std::string& name, at::Tensor value);

}  // namespace dtensor::nn
