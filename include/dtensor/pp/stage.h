// Pipeline parallelism's runtime (torch.distributed.pipelining: PipelineStage, and a schedule's step() executing its
// action lists, _PipelineScheduleRuntime). A stage is a contiguous part of a model on one rank of the "pp" mesh dim;
// the schedule (schedule.h) says, for every rank, in which order its stages run forwards and backwards of which
// microbatch, and where activations and gradients travel.
//
//   dtensor::pp::PipelineStage stage(forward, parameters, /*stage_index=*/rank, /*num_stages=*/pp, pp_group);
//   dtensor::pp::PipelineSchedule schedule({&stage}, {ScheduleKind::OneFOneB, pp, 1, /*microbatches=*/4}, loss_fn);
//   std::vector<at::Tensor> losses = schedule.step(inputs, targets);  // the last stage's rank: one per microbatch
//
// What travels. A stage's output goes to the next stage's rank by c10d send/recv on the pp group (async sends, waited
// at the step's end; a recv posted where the program says and waited just before the compute that reads it). The
// first send of a step from each stage carries a small header (dtype, shape, and for a DTensor its placements):
// shapes are agreed once per step, then every microbatch's tensor travels alone. A DTensor activation (a sequence-
// parallel hidden state, Shard(1) over "tp") travels as each rank's local shard to the rank of the same TP
// coordinate in the next stage, and is rebuilt there on the stage's `boundary_mesh` with the same placements; its
// gradient comes back the same way. Stages of one rank hand tensors over in memory.
//
// Autograd. A stage's received input is a fresh leaf: its backward stops there and the leaf's gradient is what is sent
// back. The last stage's loss of each microbatch is scaled by 1/m before its backward, so parameters' .grad hold the
// mean over microbatches (PyTorch's scale_grads, as gradient accumulation at pp 1 computes it); step() returns the
// unscaled losses. Zero bubble's I runs autograd::grad with respect to the input (the graph kept), its W the backward
// with respect to the parameters alone.
//
// Failures: a peer that dies or stops mid-step fails the waiting recv or send within the group's timeout, naming the
// action ("stage 1 RECV_F of microbatch 2 from pp rank 0"); the group is then failed (process_group.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/pp/schedule.h"

namespace dtensor::pp {

class PipelineStage {
 public:
  using Forward = std::function<at::Tensor(const at::Tensor& input)>;
  // forward: the stage's computation (the first stage's input is the schedule's microbatch; the last stage's output
  // goes to the loss). parameters: those zero bubble's W differentiates (the ones requiring grad are kept).
  // group: the pp group (stage s lives on its rank s % group size); null with one rank. boundary_mesh: the mesh a
  // received DTensor activation is rebuilt on (the stage's TP mesh); needed only when activations are DTensors.
  PipelineStage(Forward forward, std::vector<at::Tensor> parameters, int stage_index, int num_stages,
                ProcessGroup* group, std::optional<DeviceMesh> boundary_mesh = std::nullopt);

  int stage_index() const { return stage_index_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return stage_index_ == 0; }
  bool is_last() const { return stage_index_ == num_stages_ - 1; }
  const Forward& forward() const { return forward_; }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }
  ProcessGroup* group() const { return group_; }
  // Runs before each backward that computes this stage's parameters' gradients (B, or zero bubble's W) with the
  // microbatch and whether it is the stage's last of the step: the trainer turns DDP's / FSDP's gradient reduction
  // on for the last alone (PyTorch's stage does the same with no_sync / set_requires_gradient_sync).
  using BeforeBackward = std::function<void(int microbatch, bool last)>;
  void set_before_backward(BeforeBackward hook) { before_backward_ = std::move(hook); }
  const BeforeBackward& before_backward() const { return before_backward_; }
  const std::optional<DeviceMesh>& boundary_mesh() const { return boundary_mesh_; }

 private:
  Forward forward_;
  std::vector<at::Tensor> parameters_;
  int stage_index_, num_stages_;
  ProcessGroup* group_;
  std::optional<DeviceMesh> boundary_mesh_;
  BeforeBackward before_backward_;
};

// What one step did on this rank (measured): llama_train prints it, tests compare the idle share with simulate()'s.
struct StepStats {
  double ms = 0;            // the whole step
  double compute_ms = 0;    // forwards, backwards, losses
  double wait_ms = 0;       // blocked in recvs (and the sends' final wait): the bubble as this rank saw it
  int64_t bytes_sent = 0;   // activations, gradients and headers
  int64_t messages_sent = 0;
};

class PipelineSchedule {
 public:
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
  // stages: this rank's, in model order (spec.stages_of(pp rank)); each outlives the schedule. loss_fn: the last
  // stage's loss of one microbatch (a scalar, a DTensor under loss parallel). Throws dtensor::Error for stages that
  // are not the spec's for this rank, and for a spec validate() refuses.
  PipelineSchedule(std::vector<PipelineStage*> stages, ScheduleSpec spec, LossFn loss_fn);

  // One step over m microbatches: inputs[i] is microbatch i's input to the first stage (needed on the first stage's
  // rank only; others pass an empty vector), targets[i] its target (the last stage's rank only). Gradients accumulate
  // into the parameters' .grad (zero them before). Returns the m unscaled losses on the last stage's rank, else empty.
  std::vector<at::Tensor> step(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets);
  // The same, the batch split into m microbatches along dim 0 (PyTorch's split of step's args); a batch that does not
  // split evenly throws naming it.
  std::vector<at::Tensor> step_batch(const at::Tensor& input, const at::Tensor& target);

  const ScheduleSpec& spec() const { return spec_; }
  const std::vector<Action>& program() const { return program_; }  // this rank's actions
  const StepStats& last_stats() const { return stats_; }
  int pp_rank() const { return pp_rank_; }

 private:
  struct Microbatch;  // one stage's state for one microbatch (src/pp/stage.cpp)
  struct Runner;
  std::vector<PipelineStage*> stages_;
  ScheduleSpec spec_;
  LossFn loss_fn_;
  int pp_rank_ = 0;
  std::vector<Action> program_;
  StepStats stats_;
};

}  // namespace dtensor::pp
