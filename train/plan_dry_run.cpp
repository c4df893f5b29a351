#include "train/plan_dry_run.h"

#include <ATen/ATen.h>

#include "dtensor/core/error.h"
#include "dtensor/cp/context_parallel.h"
#include "dtensor/tp/loss_parallel.h"
#include "llama/model.h"
#include "llama/parallelize.h"
#include "train/data.h"
#include "train/step.h"

namespace train {

PlanOptions plan_options_of(const train::TrainOptions& o, int64_t tp) {
  PlanOptions p;
  p.model = o.model;
  p.seq_len = o.seq_len;
  p.batch = o.batch;
  p.tp = tp;
  p.dp = o.dp;
  p.ep = o.ep;
  p.cp = o.cp;
  p.cp_rotate_method = o.cp_rotate_method;
  p.data_parallel = o.data_parallel;
  p.tp_plan = o.plan;
  p.sequence_parallel = o.sequence_parallel;
  p.loss_parallel = o.loss_parallel;
  p.async_tp = o.async_tp;
  p.param_dtype = param_dtype(o);
  p.mp_policy = mp_policy(o);
  if (o.float8) p.float8 = dtensor::Float8LinearConfig{.recipe = o.float8_recipe};
  return p;
}

dtensor::DryRunReport dry_run_llama(const PlanOptions& o) {
  DTENSOR_CHECK(o.tp >= 1 && o.dp >= 1, "llama_plan: --tp and --dp must be >= 1");
  DTENSOR_CHECK(o.batch % o.dp == 0, "llama_plan: batch ", o.batch, " is not divisible by dp ", o.dp);
  o.model.validate();
  DTENSOR_CHECK(o.ep >= 1 && o.dp % o.ep == 0, "llama_plan: --ep ", o.ep, " does not divide --dp ", o.dp);
  DTENSOR_CHECK(o.cp >= 1 && (o.cp == 1 || o.ep == 1), "llama_plan: --cp with --ep is not supported");
  // llama_train's mesh: the same rule (models::ParallelDims::mesh_shape).
  models::ParallelDims degrees;
  degrees.dp = o.dp, degrees.tp = o.tp, degrees.ep = o.ep, degrees.cp = o.cp;
  const std::vector<int64_t> shape = degrees.mesh_shape();
  dtensor::DryRunOptions options;
  options.mesh_dim_names = degrees.mesh_dim_names();
  options.ranks = o.ranks;
  if (!o.optimizer) options.optimizer = nullptr;
  const bool loss_parallel = o.loss_parallel && o.tp > 1 && o.tp_plan == llama::TPPlan::torchtitan;
  // The same parallelize_llama as llama_train's, so the same plan.
  const llama::ParallelizeConfig config{
      .plan = o.tp_plan,
      .tp = {.sequence_parallel = o.sequence_parallel, .loss_parallel = o.loss_parallel, .async_tp = o.async_tp},
      .mp_policy = o.mp_policy,
      .float8 = o.float8};
  // Held over forward and backward, as llama_train holds it.
  if (loss_parallel) options.step_guard = [] { return std::make_shared<dtensor::LossParallelGuard>(); };
  return dtensor::dry_run<llama::LlamaForCausalLM>(
      [&] {
        llama::LlamaForCausalLM model(o.model);
        if (o.param_dtype != at::kFloat) model->to(o.param_dtype);
        return model;
      },
      shape,
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) {
        llama::parallelize_llama(model, models::ParallelDims::from_mesh(mesh, o.data_parallel, o.cp), config);
      },
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) {
        // Token ids: where the forward reads DTensors (TP > 1), plain tensors beside them stay on the CPU
        // (b·s longs; ops/op_call.cpp says why); with TP 1 the forward is plain and all of it is meta. The
        // model's own plain tensors (rotary tables, masks) follow the tokens' device.
        // HF's plan keeps the activations plain local tensors (its styles return local outputs): as at TP 1,
        // everything beside them is meta.
        const bool dtensor_forward = o.tp > 1 && o.tp_plan == llama::TPPlan::torchtitan;
        const at::Tensor global =
            at::zeros({o.batch, o.seq_len}, at::TensorOptions(at::kLong).device(dtensor_forward ? at::kCPU : at::kMeta));
        const models::ParallelDims dims = models::ParallelDims::from_mesh(mesh, o.data_parallel, o.cp);
        // As llama_train: this rank's rows, and under context parallelism its chunks of each row and their positions.
        const train::Batch batch = train::local_batch({global, global}, dims);
        if (!dims.cp_enabled()) return train::training_loss(model, batch.inputs, batch.labels, train::sum_over_data_ranks(dims));
        dtensor::cp::ContextParallel guard(dims.cp_mesh(), {.rotate_method = dtensor::cp::rotate_method_from_string(o.cp_rotate_method)});
        return train::training_loss(model, batch.inputs, batch.labels, train::sum_over_data_ranks(dims),
                                    batch.positions.to(batch.inputs.device()));
      },
      options);
}

}  // namespace train
