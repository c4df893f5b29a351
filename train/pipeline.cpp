#include "train/pipeline.h"

#include <ATen/ATen.h>

#include "dtensor/core/error.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/mesh/functional_collectives.h"
#include "train/step.h"

namespace train {

dtensor::pp::ScheduleSpec pipeline_spec(const TrainOptions& o) {
  dtensor::pp::ScheduleSpec spec;
  spec.kind = dtensor::pp::schedule_from_string(o.pp_schedule);
  spec.pp = static_cast<int>(o.pp);
  spec.stages_per_rank = 1;
  spec.microbatches = static_cast<int>(o.pp_microbatches > 0 ? o.pp_microbatches : o.pp);
  spec.check();
  return spec;
}

llama::StageLayers pipeline_stage_layers(const TrainOptions& o, int64_t pp_rank) {
  const auto points = o.pp_split_points.empty() ? std::vector<int64_t>{} : llama::split_points_from_string(o.pp_split_points);
  return llama::split_stages(o.model, o.pp, points)[static_cast<size_t>(pp_rank)];
}

Pipeline::Pipeline(const llama::LlamaForCausalLM& model, const TrainOptions& o, const models::ParallelDims& dims,
                   dtensor::pp::PipelineSchedule::LossFn loss_fn)
    : pp_mesh_(dims.pp_mesh()) {
  const dtensor::pp::ScheduleSpec spec = pipeline_spec(o);
  const int pp_rank = static_cast<int>(dims.pp_rank());
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p);
  // A DTensor activation (sequence parallel's Shard(1) hidden states) is rebuilt on the stage's TP mesh.
  std::optional<dtensor::DeviceMesh> boundary;
  if (dims.tp_enabled()) boundary = dims.tp_mesh();
  // Sequence parallel's hidden states between layers are each TP rank's rows of the sequence (stage_forward).
  std::optional<dtensor::DeviceMesh> sp;
  if (dims.tp_enabled() && o.plan == llama::TPPlan::torchtitan && o.sequence_parallel) sp = dims.tp_mesh();
  stage_ = std::make_unique<dtensor::pp::PipelineStage>(llama::stage_forward(model, sp), params, pp_rank, spec.pp,
                                                        &pp_mesh_.get_group(0), boundary);
  // DDP's and FSDP's reductions in the stage's last backward only; the microbatches before add up locally.
  if (spec.microbatches > 1) {
    stage_->set_before_backward([m = model](int, bool last) mutable { dtensor::set_requires_gradient_sync(*m, last); });
  }
  schedule_ = std::make_unique<dtensor::pp::PipelineSchedule>(std::vector<dtensor::pp::PipelineStage*>{stage_.get()},
                                                              spec, std::move(loss_fn));
}

double Pipeline::forward_backward(const at::Tensor& inputs, const at::Tensor& labels) {
  const std::vector<at::Tensor> losses = schedule_->step_batch(inputs, labels);
  double sum = 0;
  for (const auto& l : losses) sum += loss_value(l);
  const double mean = losses.empty() ? 0.0 : sum / static_cast<double>(losses.size());
  // The last stage's rank alone holds the losses: a sum over the pp group gives every rank its value.
  return dtensor::all_reduce(at::full({1}, mean, at::kDouble), dtensor::ReduceOp::SUM, pp_mesh_, 0).item<double>();
}

}  // namespace train
