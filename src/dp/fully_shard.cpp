// fully_shard (include/dtensor/dp/fully_shard.h): takes a module's parameters into one
// FsdpParamGroup (dp/fsdp_param_group.h) and wires it to the module's forward hooks and to autograd.
#include "dtensor/dp/fully_shard.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>

#include "dtensor/core/error.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/dp/replicate.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/tensor/shard_layout.h"
#include "dp/fsdp_param_group.h"
#include "dp/taken_parameters.h"

namespace dtensor {
namespace {

using detail::FsdpParam;
using detail::FsdpParamGroup;
using detail::ParameterUses;
using detail::TakenRegistry;
using detail::untaken_parameters;

// The sharded parameters of every fully_shard call, with their group.
TakenRegistry<std::weak_ptr<FsdpParamGroup>> registry;

class GradientArrived final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradientArrived(std::weak_ptr<FsdpParamGroup> group, size_t index) : group_(std::move(group)), index_(index) {}
  void operator()(const torch::autograd::Variable&) override {
    if (auto g = group_.lock()) g->on_gradient(index_);
  }

 private:
  std::weak_ptr<FsdpParamGroup> group_;
  size_t index_;
};

// The dp shard of parameter `p` (plain, or a TP DTensor on `tp_mesh`) as an FsdpParam.
FsdpParam shard_parameter(const at::Tensor& p, const std::string& path, const DeviceMesh& mesh,
                          const std::optional<DeviceMesh>& tp_mesh, int64_t dp, int64_t dp_rank) {
  FsdpParam fp;
  at::Tensor tp_local;
  Placement tp_placement = Replicate();
  std::vector<int64_t> global = p.sizes().vec();
  if (is_dtensor(p)) {
    const DTensorSpec& spec = dtensor_spec(p);
    DTENSOR_CHECK(tp_mesh && spec.mesh == *tp_mesh, "dtensor: fully_shard: parameter '", path, "' is a DTensor on ",
                  spec.mesh.to_string(), "; fully_shard on ", mesh.to_string(),
                  " takes plain parameters or DTensors on its tp dim");
    DTENSOR_CHECK(!spec.placements[0].is_partial(), "dtensor: fully_shard: parameter '", path, "' is ",
                  to_string(spec.placements));
    fp.tp_spec = spec;
    tp_placement = spec.placements[0];
    tp_local = detail::local_tensor(p);
    global = spec.meta.shape;
  } else {
    tp_local = p.detach();
  }
  DTENSOR_CHECK(tp_local.dim() != 0, "dtensor: fully_shard: parameter '", path, "' is 0-d (nothing to shard)");
  // FSDP's Shard(0) over dp on the TP-local tensor: where TP already shards dim 0 that is a shard of the
  // TP shard, _StridedShard(0, sf = tp).
  Placements placements{Shard(0)};
  if (tp_mesh) {
    placements = {tp_placement.is_shard(0) ? _StridedShard(0, tp_mesh->size()) : Shard(0), tp_placement};
  }
  fp.local_shape = tp_local.sizes().vec();
  fp.rows = chunk_sizes(fp.local_shape[0], dp);
  fp.padded_rows = fp.rows[0];  // torch.chunk: the first chunk is the largest
  fp.row_numel = fp.local_shape[0] == 0 ? 0 : tp_local.numel() / fp.local_shape[0];
  at::Tensor mine = tp_local.narrow(0, chunk_offset(fp.rows, dp_rank), fp.rows[dp_rank]).clone(at::MemoryFormat::Contiguous);
  DTensorSpec spec(mesh, placements, TensorMeta{global, {}, tp_local.scalar_type()});
  // The global indices `mine` holds (dp-chunk dp_rank of the TP-local rows) must be its shard under
  // `placements` (PyTorch's FSDP2 assumes so; with uneven pieces a _StridedShard cuts differently).
  std::vector<Runs> held = fp.tp_spec ? shard_runs(global, *tp_mesh, fp.tp_spec->placements, *tp_mesh->get_coordinate())
                                      : shard_runs(global, mesh, replicate_all(mesh.ndim()), *mesh.get_coordinate());
  held[0] = split_runs(held[0], Shard(0), dp, dp_rank);
  DTENSOR_CHECK(held == shard_runs(global, mesh, placements, *mesh.get_coordinate()),
                "dtensor: fully_shard: parameter '", path,
                "': its dp shard of the TP-local tensor is not its shard under ", to_string(placements),
                " (uneven TP and dp splits of dim 0)");
  fp.sharded = detail::make_dtensor(mine, spec, p.requires_grad());
  return fp;
}

}  // namespace

bool is_fully_sharded(const at::Tensor& parameter) { return registry.contains(parameter); }

namespace detail {
bool set_fsdp_requires_gradient_sync(const at::Tensor& parameter, bool requires_gradient_sync) {
  const auto taken_by = registry.find(parameter);
  if (!taken_by) return false;
  auto group = taken_by->lock();
  if (!group) return false;
  group->set_requires_gradient_sync(requires_gradient_sync);
  return true;
}
}  // namespace detail

void fully_shard(torch::nn::Module& module, const DeviceMesh& mesh, FullyShardOptions options) {
  const DeviceMesh dp_mesh = data_parallel_mesh(mesh);
  std::optional<DeviceMesh> tp_mesh;
  DTENSOR_CHECK(mesh.ndim() < 2 || (mesh.ndim() == 2 && mesh.mesh_dim_names().at(0) == "dp"),
                "dtensor: fully_shard needs a 1-D dp mesh or a 2-D (\"dp\", \"tp\") mesh, got ", mesh.to_string());
  if (mesh.ndim() == 2) tp_mesh = mesh.slice({mesh.mesh_dim_names().at(1)});
  const int64_t dp = dp_mesh.size(), dp_rank = dp_mesh.get_local_rank(0);

  // The parameters under `module` that no earlier fully_shard took (one entry per tensor: tied weights
  // have several uses). Taking any earlier ones' is what makes this the root.
  bool is_root = false;
  std::vector<std::shared_ptr<FsdpParamGroup>> children;  // the earlier calls' groups under `module`
  const auto untaken = untaken_parameters(module, [&](const at::Tensor& p) {
    const auto taken_by = registry.find(p);
    if (!taken_by) return false;
    is_root = true;  // taking an earlier call's parameters is what makes this the root
    auto child = taken_by->lock();
    if (child && std::find(children.begin(), children.end(), child) == children.end()) children.push_back(child);
    return true;
  });
  std::vector<FsdpParam> params;
  for (const ParameterUses& u : untaken) {
    FsdpParam fp = shard_parameter(u.tensor, u.path, mesh, tp_mesh, dp, dp_rank);
    DTENSOR_CHECK(params.empty() || fp.sharded.scalar_type() == params.front().sharded.scalar_type(),
                  "dtensor: fully_shard: parameters of one module must share a dtype ('", u.path, "')");
    fp.uses = u.uses;
    params.push_back(std::move(fp));
  }
  DTENSOR_CHECK(!params.empty(), "dtensor: fully_shard: module ", module.name(), " has no parameters left to shard");

  for (const FsdpParam& p : params) {
    for (const auto& [owner, name] : p.uses) nn::replace_parameter(*owner, name, p.sharded);
  }
  auto group = std::make_shared<FsdpParamGroup>(std::move(params), mesh, dp_mesh, is_root, options);
  for (const FsdpParam& p : group->params()) registry.add(p.sharded, group);
  if (is_root) {  // the root and the groups under it: one forward order, for prefetching
    auto schedule = std::make_shared<detail::FsdpSchedule>();
    group->set_schedule(schedule);
    for (const auto& child : children) child->set_schedule(schedule);
  }
  for (size_t k = 0; k < group->params().size(); ++k) {
    const at::Tensor& leaf = group->params()[k].unsharded;
    if (leaf.requires_grad()) {
      torch::autograd::impl::set_post_acc_grad_hooks(leaf, std::make_unique<GradientArrived>(group, k));
    }
  }
  // Before forward: gather. After forward: free (not the root), and gather again when the output's
  // gradient arrives, i.e. just before this module's backward.
  const MixedPrecisionPolicy mp = options.mp_policy;
  nn::register_forward_pre_hook(module, nn::ForwardPreHook([group, mp](torch::nn::Module&, nn::Args args, nn::KwArgs kwargs) {
    group->on_forward_start();
    if (mp.param_dtype && mp.cast_forward_inputs) {
      for (auto& a : args) a = detail::cast_floating(a, *mp.param_dtype);
      for (auto& [_, v] : kwargs) v = detail::cast_floating(v, *mp.param_dtype);
    }
    return std::make_pair(std::move(args), std::move(kwargs));
  }));
  nn::register_forward_hook(module, nn::ForwardHook([group, mp](torch::nn::Module&, const nn::Args&, c10::IValue output) {
    const bool will_reshard = !group->is_root() && group->options_reshard_after_forward();
    if (will_reshard && c10::GradMode::is_enabled()) {
      std::weak_ptr<FsdpParamGroup> weak = group;
      auto hook = [weak](const at::Tensor&) {
        if (auto g = weak.lock()) g->on_backward_start();
      };
      if (output.isTensor() && output.toTensor().requires_grad()) {
        output.toTensor().register_hook(hook);
      } else if (output.isTuple()) {
        for (const auto& v : output.toTupleRef().elements()) {
          if (v.isTensor() && v.toTensor().requires_grad()) v.toTensor().register_hook(hook);
        }
      }
    }
    group->on_forward_end();
    if (mp.output_dtype) output = detail::cast_floating(output, *mp.output_dtype);
    return output;
  }));
}

}  // namespace dtensor
