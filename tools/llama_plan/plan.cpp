#include "plan.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dtensor/error.h"
#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/parallel/loss_parallel.h"
#include "dtensor/tensor/dtensor.h"
#include "llama/model.h"
#include "llama/parallelize.h"
#include "trainer.h"

namespace llama_plan {

void data_parallel_gradient_sync(const dtensor::DeviceMesh& mesh, const std::vector<at::Tensor>& params) {
  const auto& names = mesh.mesh_dim_names();
  if (std::find(names.begin(), names.end(), "dp") == names.end() || mesh.size("dp") == 1) return;
  constexpr int64_t kBucketBytes = 25 * 1024 * 1024;
  const dtensor::CommScopeGuard scope("(data parallel)");
  std::vector<at::Tensor> bucket;
  int64_t bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    std::vector<at::Tensor> flat;
    for (const auto& g : bucket) flat.push_back(g.reshape({-1}));
    dtensor::all_reduce(at::cat(flat), dtensor::ReduceOp::AVG, mesh.get_group("dp"));
    bucket.clear();
    bytes = 0;
  };
  // Reverse registration order: the order in which backward produces them, as DDP's buckets.
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    if (!it->grad().defined()) continue;
    at::Tensor local = dtensor::is_dtensor(it->grad()) ? dtensor::to_local(it->grad()) : it->grad();
    bucket.push_back(local);
    bytes += local.numel() * static_cast<int64_t>(local.element_size());
    if (bytes >= kBucketBytes) flush();
  }
  flush();
}

dtensor::DryRunReport dry_run_llama(const PlanOptions& o) {
  if (o.tp < 1 || o.dp < 1) throw dtensor::Error("llama_plan: --tp and --dp must be >= 1");
  if (o.batch % o.dp != 0) {
    throw dtensor::Error("llama_plan: batch " + std::to_string(o.batch) + " is not divisible by dp " +
                         std::to_string(o.dp));
  }
  o.model.validate();
  const bool two_d = o.dp > 1;
  const std::vector<int64_t> shape = two_d ? std::vector<int64_t>{o.dp, o.tp} : std::vector<int64_t>{o.tp};
  dtensor::DryRunOptions options;
  options.mesh_dim_names = two_d ? std::vector<std::string>{"dp", "tp"} : std::vector<std::string>{"tp"};
  options.ranks = o.ranks;
  if (!o.optimizer) options.optimizer = nullptr;
  const bool loss_parallel = o.loss_parallel && o.tp > 1;
  options.after_backward = data_parallel_gradient_sync;
  // Held over forward and backward, as llama_train holds it.
  if (loss_parallel) options.step_guard = [] { return std::make_shared<dtensor::LossParallelGuard>(); };
  return dtensor::dry_run<llama::LlamaForCausalLM>(
      [&] { return llama::LlamaForCausalLM(o.model); }, shape,
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) {
        if (o.tp > 1) {
          llama::apply_tp(model, mesh["tp"],
                          {.sequence_parallel = o.sequence_parallel, .loss_parallel = o.loss_parallel});
        }
      },
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh&) {
        const at::Tensor tokens = at::empty({o.batch / o.dp, o.seq_len}, at::TensorOptions(at::kLong).device(at::kMeta));
        return llama_train::next_token_loss(model(tokens), tokens);
      },
      options);
}

}  // namespace llama_plan
