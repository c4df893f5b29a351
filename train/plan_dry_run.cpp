#include "train/plan_dry_run.h"

#include <ATen/ATen.h>

#include "dtensor/core/error.h"
#include "dtensor/cp/context_parallel.h"
#include "dtensor/tp/loss_parallel.h"
#include "llama/build.h"
#include "llama/model.h"
#include "llama/parallelize.h"
#include "train/data.h"
#include "train/step.h"
#include "train/pipeline.h"
#include "dtensor/api/dtensor_api.h"

namespace train {

namespace {

// The dry run's options as llama_train's step runs: the mesh's dim names, the simulated ranks, AdamW, and loss
// parallel's guard held over forward and backward.
dtensor::DryRunOptions options_for(const PlanOptions& o, const models::ParallelDims& degrees, bool loss_parallel) {
  dtensor::DryRunOptions options;
  options.mesh_dim_names = degrees.mesh_dim_names();
  options.ranks = o.ranks;
  if (!o.optimizer) options.optimizer = nullptr;
  if (loss_parallel) options.step_guard = [] { return std::make_shared<dtensor::LossParallelGuard>(); };
  return options;
}

// The meta model parallelized on a simulated rank's mesh as llama::build_model does it.
void parallelize_as_built(llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh, const PlanOptions& o,
                          const llama::ParallelizeConfig& config) {
  const models::ParallelDims dims = models::ParallelDims::from_mesh(mesh, o.data_parallel, o.cp);
  if (!o.lora()) return llama::parallelize_llama(model, dims, config);
  // The adapters between the model-parallel plan and data parallel (the base frozen: no gradients, no AdamW state;
  // the adapters' gradients reduced where their placements ask).
  llama::apply_model_parallel(model, dims, config);
  // (--lora-adapter's values are not read: its config gave the shapes, and a meta model holds no values.)
  llama::add_lora_adapters(model, {.config = *lora_config(o), .adapter_dir = "", .seed = o.seed}, config.gradient_sync);
  llama::apply_data_parallel(model, dims, config);
}

// Token ids [rows, seq_len]: where the forward reads DTensors (TP > 1), plain tensors beside them stay on the CPU
// (b·s longs; ops/op_call.cpp says why); with TP 1 the forward is plain and all of it is meta. The model's own plain
// tensors (rotary tables, masks) follow the tokens' device. HF's plan keeps the activations plain local tensors (its
// styles return local outputs): as at TP 1, everything beside them is meta.
at::Tensor token_ids(const PlanOptions& o, int64_t rows) {
  const bool dtensor_forward = o.tp > 1 && o.plan == llama::TPPlan::torchtitan;
  return at::zeros({rows, o.seq_len}, at::TensorOptions(at::kLong).device(dtensor_forward ? at::kCPU : at::kMeta));
}

}  // namespace

PlanOptions plan_options_of(const train::TrainOptions& o, int64_t tp) {
  PlanOptions p(o);
  p.tp = tp;
  return p;
}

dtensor::DryRunReport dry_run_llama(const PlanOptions& o) {
  DTENSOR_CHECK(o.tp >= 1 && o.dp >= 1, "llama_plan: --tp and --dp must be >= 1");
  DTENSOR_CHECK(o.batch % o.dp == 0, "llama_plan: batch ", o.batch, " is not divisible by dp ", o.dp);
  o.model.validate();
  DTENSOR_CHECK(o.ep >= 1 && o.dp % o.ep == 0, "llama_plan: --ep ", o.ep, " does not divide --dp ", o.dp);
  DTENSOR_CHECK(o.cp >= 1 && (o.cp == 1 || o.ep == 1), "llama_plan: --cp with --ep is not supported");
  // llama_train's degrees and mesh rule (models::ParallelDims::mesh_shape) and its parallelize_llama config.
  const models::ParallelDims degrees = parallel_dims(o, o.dp * o.cp * o.tp);
  const std::vector<int64_t> shape = degrees.mesh_shape();
  const bool loss_parallel = o.loss_parallel && o.tp > 1 && o.plan == llama::TPPlan::torchtitan;
  const dtensor::DryRunOptions options = options_for(o, degrees, loss_parallel);
  const llama::ParallelizeConfig config = parallelize_config(o);
  const at::ScalarType dtype = param_dtype(o);
  return dtensor::dry_run<llama::LlamaForCausalLM>(
      [&] {
        llama::LlamaForCausalLM model(o.model);
        if (dtype != at::kFloat) model->to(dtype);
        return model;
      },
      shape,
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) { parallelize_as_built(model, mesh, o, config); },
      [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) {
        const at::Tensor global = token_ids(o, o.batch);
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

PipelinePlan dry_run_llama_pipeline(const PlanOptions& o) {
  DTENSOR_CHECK(o.pp > 1, "llama_plan: dry_run_llama_pipeline needs --pp > 1");
  DTENSOR_CHECK(o.cp == 1 && o.ep == 1, "llama_plan: --pp with --cp or --ep is not supported");
  PipelinePlan plan;
  const dtensor::pp::ScheduleSpec spec = pipeline_spec(o);
  plan.microbatches = spec.microbatches;
  const int64_t rows = o.batch / o.dp;
  DTENSOR_CHECK(rows % spec.microbatches == 0, "llama_plan: --pp-microbatches ", spec.microbatches,
                " does not divide a dp rank's ", rows, " rows");
  const int64_t mb = rows / spec.microbatches;
  const auto sim = dtensor::pp::simulate(dtensor::pp::rank_programs(spec), spec);
  plan.bubble_fraction = sim.bubble_fraction;
  const models::ParallelDims degrees = parallel_dims(o, o.dp * o.tp);
  const llama::ParallelizeConfig config = parallelize_config(o);
  const at::ScalarType dtype = param_dtype(o);
  const bool sp = o.tp > 1 && o.plan == llama::TPPlan::torchtitan && o.sequence_parallel;
  const int64_t local_seq = sp ? o.seq_len / o.tp : o.seq_len;
  const int64_t act_bytes = mb * local_seq * o.model.hidden_size * static_cast<int64_t>(c10::elementSize(compute_dtype(o)));
  plan.p2p_bytes_per_step = 2 * spec.microbatches * act_bytes;
  for (int s = 0; s < spec.pp; ++s) {
    PipelinePlan::Stage stage;
    stage.layers = pipeline_stage_layers(o, s);
    const bool loss_parallel = stage.layers.head && o.loss_parallel && o.tp > 1 && o.plan == llama::TPPlan::torchtitan;
    const dtensor::DryRunOptions options = options_for(o, degrees, loss_parallel);
    stage.report = dtensor::dry_run<llama::LlamaForCausalLM>(
        [&] {
          llama::LlamaForCausalLM model(o.model);
          llama::keep_stage(model, stage.layers);
          if (dtype != at::kFloat) model->to(dtype);
          return model;
        },
        degrees.mesh_shape(),
        [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) { parallelize_as_built(model, mesh, o, config); },
        [&](llama::LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh) {
          std::optional<dtensor::DeviceMesh> sp_mesh;
          if (sp) sp_mesh = models::ParallelDims::from_mesh(mesh, o.data_parallel).tp_mesh();
          const auto forward = llama::stage_forward(model, sp_mesh);
          at::Tensor input;
          if (stage.layers.embeddings) {
            input = token_ids(o, mb);
          } else {  // what the previous stage sends: this rank's rows of the hidden states, a leaf
            input = at::zeros({mb, local_seq, o.model.hidden_size}, at::TensorOptions(compute_dtype(o)).device(at::kMeta))
                        .requires_grad_(true);
          }
          at::Tensor out = forward(input);
          if (stage.layers.head) return next_token_loss(out, token_ids(o, mb));
          return (dtensor::is_dtensor(out) ? dtensor::to_local(out) : out).sum();  // a gradient of the output's shape
        },
        options);
    const auto& r0 = stage.report.ranks.front();
    stage.in_flight = sim.peak_activations[static_cast<size_t>(s)];
    stage.peak_bytes_with_schedule = r0.peak_bytes + (stage.in_flight - 1) * r0.activation_bytes;
    plan.stages.push_back(std::move(stage));
  }
  return plan;
}

}  // namespace train
