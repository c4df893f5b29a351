// Pipeline parallelism in the trainer (torchtitan's pipeline_llama + the schedule's step inside train_step): this
// rank's stage of the model (llama/parallelize_pipeline.h: the factory keeps its layers alone), the schedule over the
// "pp" mesh dim (dtensor/pp), and one step's forward and backward through it.
//
//   --pp N --pp-schedule GPipe|1F1B|ZBH1 --pp-microbatches M [--pp-split-points 2,4]
//
// The step's rows (this dp rank's, after gradient accumulation's micro-batches are put back together) are cut into M
// pipeline microbatches; each microbatch's loss is scaled by 1/M, so the gradients are the mean over the step's rows,
// as at pp 1. DDP's and FSDP's gradient reductions run in each stage's last backward only (earlier microbatches add
// up locally, as gradient accumulation's). The reported loss is the last stage's mean, all-reduced over the pp group
// so that every rank logs it; clipping takes the norm over every stage's gradients (clip_grad.h's pp_mesh).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "common/parallel_dims.h"
#include "dtensor/pp/stage.h"
#include "llama/model.h"
#include "llama/parallelize_pipeline.h"
#include "train/options.h"

namespace train {

// The schedule --pp, --pp-schedule and --pp-microbatches stand for (microbatches: --pp-microbatches, else pp).
dtensor::pp::ScheduleSpec pipeline_spec(const TrainOptions& options);
// The layers stage `pp_rank` holds: --pp-split-points, else torchtitan's even split.
llama::StageLayers pipeline_stage_layers(const TrainOptions& options, int64_t pp_rank);

class Pipeline {
 public:
  // model: this rank's stage (train::build_model with dims.pp > 1), parallelized on dims' stage mesh.
  // loss_fn: a microbatch's loss from the last stage's logits and its labels.
  Pipeline(const llama::LlamaForCausalLM& model, const TrainOptions& options, const models::ParallelDims& dims,
           dtensor::pp::PipelineSchedule::LossFn loss_fn);
  // Forward and backward of this rank's rows ([rows, seq]: the first stage reads inputs, the last labels); gradients
  // accumulate into the stage's parameters. Returns the mean loss over the microbatches, on every rank.
  double forward_backward(const at::Tensor& inputs, const at::Tensor& labels);
  const dtensor::pp::StepStats& last_stats() const { return schedule_->last_stats(); }
  const dtensor::pp::PipelineSchedule& schedule() const { return *schedule_; }
  const dtensor::DeviceMesh& pp_mesh() const { return pp_mesh_; }

 private:
  dtensor::DeviceMesh pp_mesh_;
  std::unique_ptr<dtensor::pp::PipelineStage> stage_;
  std::unique_ptr<dtensor::pp::PipelineSchedule> schedule_;
};

}  // namespace train
