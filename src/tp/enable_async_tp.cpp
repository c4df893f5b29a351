// enable_async_tp (dtensor/tp/enable_async_tp.h): the pass that routes sequence parallel's
// boundaries through async TP's fused ops.
#include "dtensor/tp/enable_async_tp.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/tp/async_tp.h"
#include "dtensor/api/dtensor_api.h"
#include "mesh/autograd_comm_scope.h"
#include "nn/forward_override.h"
#include "tp/style_support.h"

namespace dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a Linear's forward reads: its member handles (fully_shard points them at the gathered parameters).
torch::nn::LinearImpl& as_linear(torch::nn::Module& m) { return static_cast<torch::nn::LinearImpl&>(m); }

bool is_shard_on(const at::Tensor& t, const DeviceMesh& mesh, int64_t dim) {
  if (!t.defined() || !is_dtensor(t)) return false;
  const DTensorSpec& spec = dtensor_spec(t);
  return spec.mesh == mesh && spec.placements.size() == 1 && spec.placements[0] == Placement(Shard(dim)).normalized(t.dim());
}

int64_t normalize_dim(int64_t d, int64_t ndim) { return d < 0 ? d + ndim : d; }

// The gathered input handed to the module's forward: x's redistribute Shard(d) -> Replicate, with the
// all-gather already done by the fused op. Backward is that redistribute's: the gradient of the gathered
// input (Partial from the readers that were not fused, or Replicate) goes back to Shard(d), a
// reduce-scatter or a local slice.
struct GatheredInputFn : torch::autograd::Function<GatheredInputFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gathered, int64_t d) {
    detail::save_comm_scope(ctx);
    ctx->set_materialize_grads(false);
    ctx->saved_data["dim"] = d;
    const DTensorSpec& spec = dtensor_spec(x);
    return detail::make_dtensor(gathered, DTensorSpec(spec.mesh, {Replicate()},
                                                      TensorMeta{gathered.sizes().vec(), {}, gathered.scalar_type()}));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const CommScopeGuard scope = detail::restore_comm_scope(ctx);
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    DTENSOR_CHECK(is_dtensor(grads[0]), "dtensor: async TP: the gathered input's gradient is not a DTensor");
    return {redistribute(grads[0], {Shard(ctx->saved_data["dim"].toInt())}), at::Tensor(), at::Tensor()};
  }
};

// One SP -> TP site: the module whose pre-hook gathers, its Linear consumers, and this forward's products.
struct GatherSite {
  DeviceMesh mesh;
  int64_t dim;  // as the plan gives it (may be negative)
  std::vector<std::weak_ptr<torch::nn::Module>> consumers;
  // This forward's gathered input, as its consumers receive it: the local tensor of the Replicate DTensor
  // handed to the body (a tensor, not a storage address: a view of it is another input, and meta tensors, a
  // dry run's, have no address).
  const c10::TensorImpl* gathered = nullptr;
  std::unordered_map<const torch::nn::Module*, at::Tensor> products;
  void clear() {
    gathered = nullptr;
    products.clear();
  }
};

// Prepended to the site module's pre-hooks: runs before the style's gather, which then finds the input
// already Replicate and passes it on.
nn::ForwardPreHook gather_and_multiply(std::shared_ptr<GatherSite> site) {
  return [site](torch::nn::Module&, nn::Args args, nn::KwArgs kwargs) {
    site->clear();
    if (args.empty() || !args[0].isTensor() || !args[0].toTensor().defined()) return std::make_pair(args, kwargs);
    const at::Tensor& arrived = args[0].toTensor();
    const int64_t d = normalize_dim(site->dim, arrived.dim());
    if (d < 0 || d >= arrived.dim() - 1) return std::make_pair(args, kwargs);  // a gather along K: not fused
    at::Tensor x = is_dtensor(arrived) ? arrived : DTensor::from_local(arrived, site->mesh, {Shard(d)});
    // The style moves it as it is when it is not this rank's even Shard(d) (the fused gather takes equal shards).
    if (!is_shard_on(x, site->mesh, d) || x.size(d) % site->mesh.size() != 0) return std::make_pair(args, kwargs);
    std::vector<std::shared_ptr<torch::nn::Module>> fused;
    std::vector<at::Tensor> Bs;
    for (const auto& weak : site->consumers) {
      auto consumer = weak.lock();
      if (!consumer || !is_shard_on(as_linear(*consumer).weight, site->mesh, 0)) continue;
      fused.push_back(consumer);
      Bs.push_back(to_local(as_linear(*consumer).weight).t());  // y = x W^T: B = W^T, [in, out / tp]
    }
    if (fused.empty()) return std::make_pair(args, kwargs);
    auto [gathered, products] = fused_all_gather_matmul(to_local(x), Bs, d, site->mesh.get_group(0));
    at::Tensor replicated = GatheredInputFn::apply(x, gathered.detach(), d);
    site->gathered = detail::local_tensor(replicated).unsafeGetTensorImpl();
    for (size_t i = 0; i < fused.size(); ++i) {
      // Colwise: the product is Shard(-1) (this rank's output features), as the Linear would give it; the
      // global shape is stated, as features may split unevenly.
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = as_linear(*fused[i]).weight.size(0);
      at::Tensor y = DTensor::from_local(products[i], site->mesh, {Shard(-1)}, /*run_check=*/false, shape);
      const at::Tensor& bias = as_linear(*fused[i]).bias;
      site->products[fused[i].get()] = bias.defined() ? y + bias : y;
    }
    args[0] = replicated;
    return std::make_pair(std::move(args), std::move(kwargs));
  };
}

// A consumer handed this forward's gathered input returns its product; any other input runs its body.
nn::detail::ForwardOverride take_product(std::shared_ptr<GatherSite> site) {
  return [site](torch::nn::Module& m, const nn::Args& args, const nn::KwArgs&) -> std::optional<c10::IValue> {
    if (!site->gathered || args.empty() || !args[0].isTensor()) return std::nullopt;
    const at::Tensor& x = args[0].toTensor();
    if (!x.defined() || !is_dtensor(x) || detail::local_tensor(x).unsafeGetTensorImpl() != site->gathered) {
      return std::nullopt;
    }
    auto product = site->products.find(&m);
    if (product == site->products.end()) return std::nullopt;
    at::Tensor y = std::move(product->second);
    site->products.erase(product);
    return c10::IValue(std::move(y));
  };
}

void install_gather_site(torch::nn::Module& m, const DeviceMesh& mesh, int64_t dim, bool self_consumer) {
  auto site = std::make_shared<GatherSite>(GatherSite{mesh, dim, {}, nullptr, {}});
  std::vector<std::shared_ptr<torch::nn::Module>> consumers;
  if (self_consumer) {
    consumers.push_back(m.shared_from_this());
  } else {
    for (const auto& child : m.children()) {
      if (detail::is_linear(*child)) consumers.push_back(child);
    }
  }
  for (const auto& c : consumers) {
    site->consumers.push_back(c);
    nn::detail::register_forward_override(*c, take_product(site));
  }
  nn::detail::register_forward_pre_hook_first(m, gather_and_multiply(site));
  nn::register_forward_hook(m, nn::ForwardHook([site](torch::nn::Module&, const nn::Args&, c10::IValue out) {
    site->clear();  // products nobody took (a consumer the forward skipped) are dropped
    return out;
  }));
}

// One TP -> SP site: a Rowwise Linear whose Partial product is reduce-scattered to Shard(dim).
void install_scatter_site(torch::nn::Module& m, const DeviceMesh& mesh, int64_t dim) {
  nn::detail::register_forward_override(
      m, [mesh, dim](torch::nn::Module& module, const nn::Args& args, const nn::KwArgs&) -> std::optional<c10::IValue> {
        if (args.empty() || !args[0].isTensor()) return std::nullopt;
        const at::Tensor& x = args[0].toTensor();  // the style made it Shard(-1)
        auto& linear = as_linear(module);
        if (!x.defined() || x.dim() < 2 || !is_shard_on(x, mesh, x.dim() - 1) || !is_shard_on(linear.weight, mesh, 1)) {
          return std::nullopt;
        }
        const int64_t d = normalize_dim(dim, x.dim());
        if (d >= x.dim() - 1 || x.size(d) % mesh.size() != 0) return std::nullopt;  // the unfused path's rules
        // Rowwise: x[..., in / tp] @ W^T[in / tp, out] is Partial; its reduce-scatter is Shard(d).
        at::Tensor z = fused_matmul_reduce_scatter(to_local(x), to_local(linear.weight).t(), ReduceOp::SUM, d,
                                                   mesh.get_group(0));
        std::vector<int64_t> shape = x.sizes().vec();  // x's global shape, its features now the output's
        shape.back() = linear.weight.size(0);
        at::Tensor y = DTensor::from_local(z, mesh, {Shard(d)}, /*run_check=*/false, shape);
        return c10::IValue(linear.bias.defined() ? y + linear.bias : y);
      });
}

// The first input's layouts of a PrepareModuleInput: an SP -> TP boundary when Shard(d) -> Replicate.
std::optional<int64_t> gathered_dim(const Layouts& from, const Layouts& to) {
  if (from.empty() || to.empty() || !from[0] || !to[0]) return std::nullopt;
  if (!from[0]->is_shard() || !to[0]->is_replicate()) return std::nullopt;
  return from[0]->dim();
}

bool is_last_dim(int64_t d) { return d == -1; }

}  // namespace

int enable_async_tp(torch::nn::Module& model, const DeviceMesh& mesh, const ParallelizePlan& plan) {
  DTENSOR_CHECK(mesh.ndim() == 1, "dtensor: enable_async_tp takes the 1-D TP mesh (mesh[\"tp\"]), got ",
                mesh.to_string());
  int sites = 0;
  auto modules = model.named_modules();  // "" is the model itself
  // A second pass would fuse the fused sites again (each consumer computing its products twice over).
  for (const auto& item : modules) {
    DTENSOR_CHECK(!nn::detail::has_forward_override(*item.value()),
                  "dtensor: enable_async_tp was already applied to this model (module '", item.key(),
                  "' computes through a fused op); apply it once, after parallelize_module");
  }
  for (const auto& [pattern, style] : plan) {
    const ParallelStyle* s = style.ptr().get();
    std::optional<int64_t> gather;
    bool self_consumer = false;
    std::optional<int64_t> scatter;
    if (auto* p = dynamic_cast<const PrepareModuleInput*>(s)) {
      gather = gathered_dim(p->input_layouts, p->desired_input_layouts);
    } else if (auto* p = dynamic_cast<const PrepareModuleInputOutput*>(s)) {
      gather = gathered_dim(p->input_layouts, p->desired_input_layouts);
    } else if (auto* c = dynamic_cast<const ColwiseParallel*>(s)) {
      if (c->input_layouts.is_shard() && !is_last_dim(c->input_layouts.dim())) gather = c->input_layouts.dim();
      self_consumer = true;
    } else if (auto* r = dynamic_cast<const RowwiseParallel*>(s)) {
      if (r->output_layouts.is_shard() && !is_last_dim(r->output_layouts.dim())) scatter = r->output_layouts.dim();
    }
    if (!gather && !scatter) continue;
    for (const std::string& path : match_module_paths(model, pattern)) {
      torch::nn::Module& m = *modules[path];
      if (self_consumer && !detail::is_linear(m)) continue;  // a Colwise Embedding: no matmul to fuse
      if (scatter && !detail::is_linear(m)) continue;
      if (mesh.size() > 1) {
        if (gather) install_gather_site(m, mesh, *gather, self_consumer);
        if (scatter) install_scatter_site(m, mesh, *scatter);
      }
      ++sites;
    }
  }
  DTENSOR_CHECK(sites != 0,
                "dtensor: enable_async_tp: the plan has no sequence-parallel boundary to fuse (a PrepareModuleInput "
                "moving its first input Shard(d) -> Replicate, a ColwiseParallel with input_layouts Shard(d), or a "
                "RowwiseParallel Linear with output_layouts Shard(d)); async TP needs sequence parallel");
  return sites;
}

}  // namespace dtensor
