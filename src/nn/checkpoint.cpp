// Activation checkpointing (include/dtensor/nn/checkpoint.h): a forward wrapper (nn/forward_override.h) that runs
// the body under no_grad and gives the output one autograd node, CheckpointBackward, which recomputes and
// differentiates the body.
#include "dtensor/nn/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/nn/parameter_replacement.h"
#include "nn/forward_override.h"

namespace dtensor::nn {
namespace {

// A parameter the body read: where (module, name) and what (the tensor its member held during the forward).
struct ReadParameter {
  torch::nn::Module* module;
  std::string name;
  at::Tensor value;
  // The forward read another tensor than the registered leaf (fully_shard's gathered parameter, mixed precision's
  // cast): the recompute reads a leaf on its storage through the layer's member. Else the registered leaf itself.
  bool swap = false;
};

at::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// A leaf on `t`'s storage (a DTensor stays one), requiring grad as `t` does.
at::Tensor leaf_like(const at::Tensor& t) {
  at::Tensor leaf = t.detach();
  if (t.requires_grad()) leaf.requires_grad_(true);
  return leaf;
}

struct CheckpointBackward : torch::autograd::Node {
  detail::ForwardBody body;
  Args args;  // the body's inputs, tensors among them
  KwArgs kwargs;
  std::vector<size_t> tensor_args;  // which of args are (defined) tensors: the node's first inputs, in order
  std::vector<ReadParameter> params;  // the node's next inputs, in order
  at::Tensor rng_state;
  std::string module_name;

  std::string name() const override { return "CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    DTENSOR_CHECK(static_cast<bool>(body), "dtensor: checkpoint: the backward of ", module_name, " ran twice (retain_graph?)");
    if (grads.empty() || !grads[0].defined()) {  // no gradient reached the output
      torch::autograd::variable_list none(tensor_args.size() + params.size());
      release_variables();
      return none;
    }
    // The forward's inputs and parameters as fresh leaves, the generator at the forward's state.
    Args in = args;
    std::vector<at::Tensor> wrt;
    for (size_t i : tensor_args) {
      in[i] = leaf_like(args[i].toTensor());
      wrt.push_back(in[i].toTensor());
    }
    std::unordered_map<const c10::TensorImpl*, at::Tensor> leaves;  // a tied parameter read twice: one leaf
    std::vector<at::Tensor> current;  // what the members hold now, restored after
    for (const ReadParameter& p : params) {
      auto [it, fresh] = leaves.try_emplace(p.value.unsafeGetTensorImpl());
      if (fresh) it->second = p.swap ? leaf_like(p.value) : p.value;
      wrt.push_back(it->second);
      current.push_back(p.swap ? forward_parameter(*p.module, p.name) : at::Tensor());
      if (p.swap) set_forward_parameter(*p.module, p.name, it->second);
    }
    const at::Tensor rng_now = cpu_rng_state();
    set_cpu_rng_state(rng_state);
    at::Tensor out;
    try {
      at::AutoGradMode grad_on(true);
      out = body(in, kwargs).toTensor();
    } catch (...) {
      set_cpu_rng_state(rng_now);
      restore(current);
      throw;
    }
    set_cpu_rng_state(rng_now);
    restore(current);
    // Only what requires grad is differentiated; the others get no gradient.
    std::vector<at::Tensor> inputs;
    std::vector<size_t> where;
    for (size_t k = 0; k < wrt.size(); ++k) {
      if (wrt[k].requires_grad()) inputs.push_back(wrt[k]), where.push_back(k);
    }
    torch::autograd::variable_list result(wrt.size());
    if (!inputs.empty() && out.requires_grad()) {
      const auto g = torch::autograd::grad({out}, inputs, {grads.at(0)}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
      for (size_t j = 0; j < where.size(); ++j) result[where[j]] = g[j];
    }
    // A parameter read twice: its gradient goes once (both edges lead to the same leaf's accumulation).
    std::unordered_map<const c10::TensorImpl*, bool> given;
    for (size_t k = 0; k < params.size(); ++k) {
      const size_t at = tensor_args.size() + k;
      if (!given.try_emplace(params[k].value.unsafeGetTensorImpl(), true).second) result[at] = at::Tensor();
    }
    release_variables();
    return result;
  }

  void restore(const std::vector<at::Tensor>& current) {
    for (size_t k = 0; k < params.size(); ++k) {
      if (params[k].swap) set_forward_parameter(*params[k].module, params[k].name, current[k]);
    }
  }

  void release_variables() override {
    body = nullptr;
    args.clear();
    kwargs.clear();
    params.clear();
    rng_state = at::Tensor();
  }
};

// The parameters `module`'s forward reads, each (module, name) once, in module order.
std::vector<ReadParameter> read_parameters(torch::nn::Module& module) {
  std::vector<ReadParameter> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    torch::nn::Module& m = *item.value();
    for (const auto& p : m.named_parameters(/*recurse=*/false)) {
      at::Tensor value = forward_parameter(m, p.key());
      if (!value.defined()) continue;
      const bool swap = !(value.is_same(p.value()) && value.is_leaf());
      out.push_back({&m, p.key(), std::move(value), swap});
    }
  }
  return out;
}

c10::IValue checkpointed_forward(torch::nn::Module& module, const Args& args, const KwArgs& kwargs, const detail::ForwardBody& body) {
  if (!c10::GradMode::is_enabled()) return body(args, kwargs);  // nothing to keep: no autograd
  auto node = c10::make_intrusive<CheckpointBackward>();
  node->rng_state = cpu_rng_state();
  c10::IValue out;
  {
    at::NoGradGuard no_grad;
    out = body(args, kwargs);
  }
  DTENSOR_CHECK(out.isTensor(), "dtensor: checkpoint_wrapper: module '", module.name(),
                "' returned something else than one tensor");
  std::vector<at::Tensor> edges;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].isTensor() && args[i].toTensor().defined()) node->tensor_args.push_back(i), edges.push_back(args[i].toTensor());
  }
  node->params = read_parameters(module);
  for (const ReadParameter& p : node->params) edges.push_back(p.value);
  const bool any_grad = std::any_of(edges.begin(), edges.end(), [](const at::Tensor& t) { return t.requires_grad(); });
  if (!any_grad) return out;
  node->body = body;
  node->args = args;
  node->kwargs = kwargs;
  node->module_name = module.name();
  node->set_next_edges(torch::autograd::collect_next_edges(edges));
  at::Tensor result = out.toTensor();
  // A body that returned (a view of) an input: the node gets its own tensor, never the input's history.
  if (result.is_view() || std::any_of(edges.begin(), edges.end(), [&](const at::Tensor& t) { return t.is_same(result); })) {
    result = result.clone();
  }
  torch::autograd::set_history(result, c10::intrusive_ptr<torch::autograd::Node>(node));
  return c10::IValue(result);
}

}  // namespace

void checkpoint_wrapper(torch::nn::Module& module) { detail::register_forward_wrapper(module, checkpointed_forward); }

bool is_checkpointed(const torch::nn::Module& module) { return detail::has_forward_wrapper(module); }

}  // namespace dtensor::nn
