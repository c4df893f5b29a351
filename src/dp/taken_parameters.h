// What fully_shard and mixed_precision share (src/dp only): a registry of the parameters a call took, and the walk
// that finds the parameters under a module that no earlier call took.
//
// Both apply to each block, then the root: the root takes what the blocks left (embeddings, final norm, head). A
// registry remembers each taken parameter weakly (a dead model's entries expire) and is shared by every thread (ranks
// as threads train separate models).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtensor::detail {

template <typename Value>
class TakenRegistry {
 public:
  void add(const at::Tensor& parameter, Value value) {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(entries_, [](const auto& e) { return e.first.expired(); });
    entries_.emplace_back(c10::weak_intrusive_ptr<c10::TensorImpl>(parameter.getIntrusivePtr()), std::move(value));
  }
  // The value `parameter` was taken with; nullopt when no live entry has it.
  std::optional<Value> find(const at::Tensor& parameter) const {
    if (!parameter.defined()) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [weak, value] : entries_) {
      if (!weak.expired() && weak._unsafe_get_target() == parameter.unsafeGetTensorImpl()) return value;
    }
    return std::nullopt;
  }
  bool contains(const at::Tensor& parameter) const { return find(parameter).has_value(); }

 private:
  mutable std::mutex mu_;
  std::vector<std::pair<c10::weak_intrusive_ptr<c10::TensorImpl>, Value>> entries_;
};

// One parameter under a module: its tensor, its first path ("layers.0.mlp.up_proj.weight"), and every (owner, name)
// that holds it (tied weights have two).
struct ParameterUses {
  at::Tensor tensor;
  std::string path;
  std::vector<std::pair<torch::nn::Module*, std::string>> uses;
};

// Each parameter under `module` (itself included) once, in named_modules order, except those `taken` says an earlier
// call took (`taken` sees every use of them, so it can note what it skips).
inline std::vector<ParameterUses> untaken_parameters(torch::nn::Module& module,
                                                     const std::function<bool(const at::Tensor&)>& taken) {
  std::vector<ParameterUses> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    torch::nn::Module* owner = item.value().get();
    for (const auto& pi : owner->named_parameters(/*recurse=*/false)) {
      const at::Tensor& p = pi.value();
      if (taken(p)) continue;
      auto same = std::find_if(out.begin(), out.end(), [&](const ParameterUses& u) { return u.tensor.is_same(p); });
      if (same != out.end()) {
        same->uses.emplace_back(owner, pi.key());
        continue;
      }
      out.push_back({p, item.key().empty() ? pi.key() : item.key() + "." + pi.key(), {{owner, pi.key()}}});
    }
  }
  return out;
}

}  // namespace dtensor::detail
