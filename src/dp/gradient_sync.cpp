// Gradients reduced once (include/dtensor/dp/gradient_sync.h).
//
// A post-accumulate-grad hook on each DTensor parameter hands its gradient to the parameter's Reducer:
//   - parameters with a Replicate mesh dim (whose gradients come out Partial under sequence parallel) sit
//     in buckets, in reverse registration order (backward produces gradients roughly in that order); a
//     bucket is reduced when all its parameters have arrived, or at the end of backward;
//   - the others (all Shard) are reduced alone, at once, if their gradient's placements differ.
// Reducing a bucket: gradients that differ from their parameter only by Partial -> Replicate on some mesh
// dims, and agree on mesh, dtype and placements, are flattened into one buffer and all-reduced once per
// such dim; the gradients become views of the reduced buffer. Anything else is redistributed alone.
// With a data-parallel mesh (DDP) every parameter is bucketed, and a flushed bucket's local gradients, now
// at their parameters' placements, are flattened per dtype and all-reduced with AVG over the dp mesh once.
#include "dtensor/dp/gradient_sync.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "dtensor/core/error.h"
#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dp/fsdp_param_group.h"

namespace dtensor {
namespace {

bool has_replicate(const Placements& placements) {
  for (const auto& p : placements) {
    if (p.is_replicate()) return true;
  }
  return false;
}

// True when `from` reaches `to` by all-reduces only: equal on every mesh dim but Partial -> Replicate.
bool all_reduce_only(const Placements& from, const Placements& to) {
  for (size_t d = 0; d < from.size(); ++d) {
    if (from[d] == to[d]) continue;
    if (!(from[d].is_partial() && to[d].is_replicate())) return false;
  }
  return true;
}

at::Tensor local_of(const at::Tensor& t) { return is_dtensor(t) ? detail::local_tensor(t) : t; }

// `grad` with its local data replaced by `local` (same shape). A plain gradient gets its own storage: a view
// of the bucket as .grad cannot be detached in place (zero_grad).
at::Tensor with_local(const at::Tensor& grad, const at::Tensor& local) {
  if (!is_dtensor(grad)) return local.clone();
  return detail::make_dtensor(local, dtensor_spec(grad));
}

class Reducer {
 public:
  Reducer(const std::vector<at::Tensor>& params, const GradientSyncOptions& options)
      : slots_(params.size()), dp_mesh_(options.data_parallel_mesh), divide_factor_(options.gradient_divide_factor) {
    // Buckets of Replicate parameters (of every parameter under data parallel), by (mesh, dtype), filled
    // in reverse order up to the byte cap.
    std::map<std::pair<const void*, c10::ScalarType>, int> open;  // key -> bucket being filled
    for (size_t k = params.size(); k-- > 0;) {
      const at::Tensor& p = params[k];
      if (!dp_mesh_ && !has_replicate(placements(p))) continue;
      const auto key = std::make_pair(is_dtensor(p) ? device_mesh(p).id() : nullptr, p.scalar_type());
      const int64_t bytes = local_of(p).numel() * static_cast<int64_t>(p.element_size());
      auto it = open.find(key);
      if (it == open.end() || (buckets_[it->second].bytes > 0 && buckets_[it->second].bytes + bytes > options.bucket_cap_bytes)) {
        buckets_.emplace_back();
        it = open.insert_or_assign(key, static_cast<int>(buckets_.size() - 1)).first;
      }
      Bucket& b = buckets_[it->second];
      b.members.push_back(k);
      b.bytes += bytes;
      slots_[k].bucket = it->second;
    }
  }

  void set_sync(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    sync_ = on;
  }

  // The post-accumulate-grad hook of parameter `index`.
  void on_gradient(size_t index, const at::Tensor& param) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sync_) return;
    const CommScopeGuard scope(kCommScope);
    const at::Tensor& grad = param.grad();
    if (!grad.defined() || (!is_dtensor(grad) && !dp_mesh_)) return;
    if (!callback_queued_) {
      callback_queued_ = true;
      // At the end of this backward: reduce what buckets hold (parameters that got no gradient leave
      // their bucket incomplete). The callback runs on the thread that ran backward.
      std::weak_ptr<Reducer> self = self_;
      torch::autograd::Engine::get_default_engine().queue_callback([self] {
        if (auto r = self.lock()) r->end_of_backward();
      });
    }
    Slot& slot = slots_[index];
    if (slot.bucket < 0) {  // all-Shard parameter: alone, now
      if (placements(grad) != placements(param)) param.mutable_grad() = redistribute(grad.detach(), placements(param));
      return;
    }
    if (slot.arrived) return;
    slot.arrived = true;
    Bucket& b = buckets_[slot.bucket];
    ++b.arrived;
    if (dp_mesh_) b.arrived_params.emplace_back(index, param);
    if (is_dtensor(grad) && placements(grad) != placements(param)) b.waiting.push_back(param);
    if (b.arrived == b.members.size()) flush(b);
  }

  std::weak_ptr<Reducer> self_;

 private:
  // What the reductions count as (comm_hooks.h): they belong to no module's forward or backward.
  static constexpr const char* kCommScope = "(gradient sync)";

  struct Slot {
    int bucket = -1;
    bool arrived = false;
  };
  struct Bucket {
    std::vector<size_t> members;
    int64_t bytes = 0;
    size_t arrived = 0;
    std::vector<at::Tensor> waiting;  // parameters whose gradient needs reducing
    std::vector<std::pair<size_t, at::Tensor>> arrived_params;  // data parallel: every arrived parameter
  };

  void end_of_backward() {
    std::lock_guard<std::mutex> lock(mu_);
    const CommScopeGuard scope(kCommScope);
    callback_queued_ = false;
    for (Bucket& b : buckets_) {
      if (b.arrived > 0) flush(b);
    }
  }

  void flush(Bucket& b) {
    std::vector<at::Tensor> waiting = std::move(b.waiting);
    b.waiting.clear();
    b.arrived = 0;
    for (size_t k : b.members) slots_[k].arrived = false;
    // Groups of gradients reduced together, in first-seen order (the same on every rank).
    using Key = std::tuple<const void*, c10::ScalarType, std::string>;
    std::vector<std::pair<Key, std::vector<at::Tensor>>> groups;
    for (const at::Tensor& param : waiting) {
      const at::Tensor& grad = param.grad();
      if (!all_reduce_only(placements(grad), placements(param))) {
        param.mutable_grad() = redistribute(grad.detach(), placements(param));
        continue;
      }
      Key key{device_mesh(grad).id(), grad.scalar_type(), placements_key(grad)};
      auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
      if (it == groups.end()) {
        groups.emplace_back(key, std::vector<at::Tensor>{});
        it = groups.end() - 1;
      }
      it->second.push_back(param);
    }
    for (auto& [key, params] : groups) reduce_together(params);
    if (dp_mesh_) {
      std::vector<std::pair<size_t, at::Tensor>> arrived = std::move(b.arrived_params);
      b.arrived_params.clear();
      // Registration order, the same on every rank whatever order backward delivered them in.
      std::sort(arrived.begin(), arrived.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      average_over_dp(arrived);
    }
  }

  // DDP: the local gradients of `arrived`, flattened per dtype, all-reduced with AVG over the dp mesh once;
  // each gradient becomes a view of the averaged buffer (its placements unchanged).
  void average_over_dp(const std::vector<std::pair<size_t, at::Tensor>>& arrived) {
    std::map<c10::ScalarType, std::vector<at::Tensor>> by_dtype;
    for (const auto& [_, param] : arrived) by_dtype[param.grad().scalar_type()].push_back(param);
    for (auto& [dtype, params] : by_dtype) {
      std::vector<at::Tensor> parts;
      for (const at::Tensor& p : params) parts.push_back(local_of(p.grad()).reshape({-1}));
      at::Tensor flat = parts.size() == 1 ? parts[0].clone() : at::cat(parts);
      if (divide_factor_) {
        flat = all_reduce(flat, ReduceOp::SUM, *dp_mesh_, 0).div_(*divide_factor_);
      } else {
        flat = all_reduce(flat, ReduceOp::AVG, *dp_mesh_, 0);
      }
      int64_t offset = 0;
      for (const at::Tensor& p : params) {
        const at::Tensor local = local_of(p.grad());
        at::Tensor piece = flat.narrow(0, offset, local.numel()).view(local.sizes());
        offset += local.numel();
        p.mutable_grad() = with_local(p.grad(), piece);
      }
    }
  }

  static std::string placements_key(const at::Tensor& grad) {
    std::string s;
    for (const auto& p : placements(grad)) s += p.to_string() + ",";
    return s;
  }

  // Partial -> Replicate = all-reduce, of all of `params`' gradients in one flat buffer per mesh dim.
  static void reduce_together(const std::vector<at::Tensor>& params) {
    const at::Tensor& first = params.front().grad();
    const DeviceMesh mesh = device_mesh(first);
    const Placements from = placements(first);
    std::vector<at::Tensor> flat_parts;
    flat_parts.reserve(params.size());
    for (const at::Tensor& p : params) flat_parts.push_back(detail::local_tensor(p.grad()).reshape({-1}));
    at::Tensor flat = params.size() == 1 ? flat_parts[0] : at::cat(flat_parts);
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      if (from[d].is_partial()) flat = all_reduce(flat, from[d].reduce_op(), mesh, d);
    }
    int64_t offset = 0;
    for (const at::Tensor& p : params) {
      const at::Tensor& grad = p.grad();
      const at::Tensor& local = detail::local_tensor(grad);
      at::Tensor piece = flat.narrow(0, offset, local.numel()).view(local.sizes());
      offset += local.numel();
      p.mutable_grad() = detail::make_dtensor(piece, DTensorSpec(mesh, placements(p), dtensor_spec(grad).meta));
    }
  }

  std::mutex mu_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;
  bool sync_ = true;
  bool callback_queued_ = false;
  std::optional<DeviceMesh> dp_mesh_;
  std::optional<double> divide_factor_;
};

class SyncHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  SyncHook(std::shared_ptr<Reducer> reducer, size_t index) : reducer_(std::move(reducer)), index_(index) {}
  void operator()(const torch::autograd::Variable& param) override { reducer_->on_gradient(index_, param); }
  Reducer& reducer() const { return *reducer_; }

 private:
  std::shared_ptr<Reducer> reducer_;
  size_t index_;
};

SyncHook* hook_of(const at::Tensor& param) {
  if (!param.defined() || !param.requires_grad()) return nullptr;
  auto& hook = torch::autograd::impl::post_acc_grad_hooks(param);
  return dynamic_cast<SyncHook*>(hook.get());
}

}  // namespace

int64_t enable_gradient_sync(const std::vector<at::Tensor>& parameters, GradientSyncOptions options) {
  DTENSOR_CHECK(options.bucket_cap_bytes > 0, "dtensor: enable_gradient_sync: bucket_cap_bytes must be positive, got ",
                options.bucket_cap_bytes);
  std::vector<at::Tensor> params;
  for (const at::Tensor& p : parameters) {
    if (!p.defined() || !p.requires_grad() || !p.is_leaf()) continue;
    if (!is_dtensor(p) && !options.data_parallel_mesh) continue;
    if (torch::autograd::impl::post_acc_grad_hooks(p) != nullptr) continue;  // ours already, or another's
    if (std::any_of(params.begin(), params.end(), [&](const at::Tensor& q) { return q.is_same(p); })) continue;
    params.push_back(p);
  }
  if (params.empty()) return 0;
  DTENSOR_CHECK(!options.gradient_divide_factor || (options.data_parallel_mesh && *options.gradient_divide_factor > 0),
                "dtensor: enable_gradient_sync: gradient_divide_factor needs a data_parallel_mesh and must be positive");
  DTENSOR_CHECK(!options.data_parallel_mesh || options.data_parallel_mesh->ndim() == 1,
                "dtensor: enable_gradient_sync: data_parallel_mesh must be 1-D, got ",
                options.data_parallel_mesh->to_string());
  auto reducer = std::make_shared<Reducer>(params, options);
  reducer->self_ = reducer;
  for (size_t k = 0; k < params.size(); ++k) {
    torch::autograd::impl::set_post_acc_grad_hooks(params[k], std::make_unique<SyncHook>(reducer, k));
  }
  return static_cast<int64_t>(params.size());
}

int64_t enable_gradient_sync(torch::nn::Module& module, GradientSyncOptions options) {
  return enable_gradient_sync(nn::unique_parameters(module), options);
}

void disable_gradient_sync(torch::nn::Module& module) {
  for (const at::Tensor& p : nn::unique_parameters(module)) {
    if (hook_of(p) != nullptr) torch::autograd::impl::set_post_acc_grad_hooks(p, nullptr);
  }
}

void set_requires_gradient_sync(torch::nn::Module& module, bool requires_gradient_sync) {
  for (const at::Tensor& p : nn::unique_parameters(module)) {
    if (SyncHook* hook = hook_of(p)) hook->reducer().set_sync(requires_gradient_sync);
    detail::set_fsdp_requires_gradient_sync(p, requires_gradient_sync);  // a fully_shard parameter's group (FSDP2's)
  }
}

bool has_gradient_sync(const at::Tensor& parameter) { return hook_of(parameter) != nullptr; }

}  // namespace dtensor
