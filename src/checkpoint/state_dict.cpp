#include "dtensor/checkpoint/state_dict.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>

#include "dtensor/core/error.h"

namespace dtensor::checkpoint {
namespace {

// Each parameter of the optimizer's groups, by its name in `module` (first name of a tied parameter).
std::vector<std::pair<std::string, at::Tensor>> named_optimizer_params(torch::optim::AdamW& optimizer,
                                                                       const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::vector<const void*> seen;
  const auto named = module.named_parameters(/*recurse=*/true);
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      const void* key = p.unsafeGetTensorImpl();
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      for (const auto& item : named) {
        if (item.value().unsafeGetTensorImpl() == key) {
          out.emplace_back(item.key(), p);
          seen.push_back(key);
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict state;
  std::vector<const void*> seen;
  auto add = [&](const std::string& name, const at::Tensor& t) {
    if (!t.defined()) return;
    const void* key = t.unsafeGetTensorImpl();
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) return;
    seen.push_back(key);
    state[name] = t;
  };
  for (const auto& item : module.named_parameters(/*recurse=*/true)) add(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) add(item.key(), item.value());
  return state;
}

StateDict adamw_state_dict(torch::optim::AdamW& optimizer, const torch::nn::Module& module) {
  StateDict state;
  at::NoGradGuard no_grad;
  for (const auto& [name, p] : named_optimizer_params(optimizer, module)) {
    auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
    if (!slot) {  // as AdamW::step creates it on a parameter's first update
      auto fresh = std::make_unique<torch::optim::AdamWParamState>();
      fresh->step(0);
      fresh->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      fresh->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      slot = std::move(fresh);
    }
    auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
    state["state." + name + ".exp_avg"] = s.exp_avg();
    state["state." + name + ".exp_avg_sq"] = s.exp_avg_sq();
    state["state." + name + ".step"] = at::scalar_tensor(static_cast<double>(s.step()), at::kFloat);
  }
  return state;
}

void set_adamw_steps(torch::optim::AdamW& optimizer, const torch::nn::Module& module, const StateDict& state) {
  for (const auto& [name, p] : named_optimizer_params(optimizer, module)) {
    const auto it = state.find("state." + name + ".step");
    auto slot = optimizer.state().find(p.unsafeGetTensorImpl());
    DTENSOR_CHECK(it != state.end() && slot != optimizer.state().end(),
                  "dtensor: checkpoint: set_adamw_steps: no state for parameter '", name, "' (use adamw_state_dict)");
    static_cast<torch::optim::AdamWParamState&>(*slot->second).step(static_cast<int64_t>(it->second.item<double>()));
  }
}

}  // namespace dtensor::checkpoint
