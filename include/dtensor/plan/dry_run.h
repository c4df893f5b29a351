// Plan dry run: what one training step of a TP plan will do, learnt by running the user's own model code
// once, for one rank of an imagined mesh, on meta tensors (no data, no memory, no peers).
//
//   auto report = dtensor::dry_run<llama::LlamaForCausalLM>(
//       [&] { return llama::LlamaForCausalLM(config); },                       // built on the meta device
//       {4, 8}, [&](auto& model, const DeviceMesh& mesh) { llama::apply_tp(model, mesh["tp"]); },
//       [&](auto& model, const DeviceMesh& mesh) { return loss_of(model(tokens_on_meta)); },
//       {.mesh_dim_names = {"dp", "tp"}});
//
// How: each simulated rank gets a fake_world (fake_world.h: c10d's FakeProcessGroup, collectives
// complete at once and are still seen by the comm hooks) and a DeviceMesh of the requested shape over it;
// the model factory runs under nn::DefaultDeviceGuard(kMeta) (dtensor/nn/default_device.h), the plan and the step run through
// the real dispatch, redistribute and styles, and a backward and an optimizer step follow. What is recorded:
//   - every collective, by phase (forward / backward / optimizer), module path (comm_hooks.h's scope: a
//     backward collective counts for the module whose forward created it; gradient sync's reductions
//     count as "(gradient sync)"), type and mesh dim: count and bytes (this rank's input, as CommEvent);
//   - parameter, gradient and optimizer-state bytes of this rank (local shards);
//   - memory: every meta allocation of the run is counted (a counting allocator for the meta device), so
//     activation bytes are measured, not modelled: the bytes the forward leaves alive for the backward
//     (live after forward minus live before it), and the peak of all live bytes over the step;
//   - matmul FLOPs of this rank (mm, addmm, bmm, baddbmm and the CPU flash attention kernels, on the local
//     shapes the rank computes; the meta shape inference of the DTensor dispatch is not counted).
// Ranks: by default rank 0 and the last rank; DryRunOptions::ranks picks others (all of them for a full
// check). A rank's numbers can differ from rank 0's where shards are uneven; DryRunReport::differing_ranks
// names them. A fake group cannot know other ranks' sizes, so an exchange of sizes (uneven shards whose
// global shape is not known from the spec) sees every rank as the simulated one.
// Plan-time errors are the real ones: the plan runs exactly as in a real job.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/mesh/device_mesh.h"

namespace dtensor {

enum class StepPhase { FORWARD, BACKWARD, OPTIMIZER };
const char* step_phase_name(StepPhase phase);  // "forward", "backward", "optimizer"

// Collectives of one kind issued in one phase by one module, aggregated.
struct CommRecord {
  StepPhase phase;
  std::string module;      // module path; "" outside any hooked module; "(gradient sync)"
  std::string collective;  // "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"
  std::string mesh_dim;    // the mesh dim's name (its index when unnamed)
  int64_t group_size = 0;
  int64_t count = 0;
  int64_t bytes = 0;       // sum of this rank's input bytes
};

struct RankReport {
  int rank = 0;
  std::vector<int64_t> coordinate;
  std::vector<CommRecord> comms;  // in first-issued order
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_state_bytes = 0;
  int64_t activation_bytes = 0;   // live after forward minus live before it (what backward will read)
  int64_t peak_bytes = 0;         // most bytes live at once over the step (parameters included)
  // Bytes of every tensor the step allocated (forward, backward, optimizer step), freed or not: each op's output,
  // so a measure of the step's memory traffic beside its matmuls (the cost model's "other" time). The dispatcher's
  // own shape inference (stand-ins on a decision-cache miss) is not counted, so the number is the same in every run.
  int64_t allocated_bytes = 0;
  // DTensor operator calls of the step (forward, backward, optimizer): each goes through the sharding decision and
  // its wrappers on top of the local kernel (the cost model's per-op overhead).
  int64_t dtensor_ops = 0;
  int64_t num_params = 0;         // elements of this rank's parameters
  double matmul_flops = 0;        // forward + backward

  // Count and bytes by collective, over the records of `phase` (all phases when nullopt).
  std::map<std::string, int64_t> counts(std::optional<StepPhase> phase = std::nullopt) const;
  std::map<std::string, int64_t> bytes(std::optional<StepPhase> phase = std::nullopt) const;
};

struct DryRunReport {
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_dim_names;
  std::vector<RankReport> ranks;     // the simulated ranks, in the order asked
  std::vector<int> differing_ranks;  // simulated ranks whose numbers differ from ranks[0]'s
  double seconds = 0;                // wall time of the dry run
};

using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor> params)>;
// AdamW with default options (two state tensors per parameter, as llama_train's).
OptimizerFactory adamw_factory();

struct DryRunOptions {
  std::vector<std::string> mesh_dim_names;
  std::vector<int> ranks;                        // empty: rank 0 and the last rank
  OptimizerFactory optimizer = adamw_factory();  // null: no optimizer step
  // Made before the forward and destroyed after the backward: a guard a real step holds over both (a
  // LossParallelGuard). Null: none.
  std::function<std::shared_ptr<void>()> step_guard;
  // Runs after the backward, counted as backward (a data-parallel gradient reduction). Null: none.
  std::function<void(const DeviceMesh& mesh, const std::vector<at::Tensor>& params)> after_backward;
};

namespace detail {
DryRunReport dry_run_modules(const std::function<std::shared_ptr<torch::nn::Module>()>& build,
                             const std::vector<int64_t>& mesh_shape,
                             const std::function<void(const DeviceMesh&)>& plan,
                             const std::function<at::Tensor(const DeviceMesh&)>& step, const DryRunOptions& options);
}  // namespace detail

// Model is a module holder (TORCH_MODULE). model_factory builds it (its layers' parameters land on meta);
// plan applies the TP plan on the mesh; step runs the forward and returns the loss (its inputs should be
// meta tensors: at::empty(shape, at::kMeta)). dry_run runs the backward and the optimizer step itself.
template <typename Model>
DryRunReport dry_run(const std::function<Model()>& model_factory, const std::vector<int64_t>& mesh_shape,
                     const std::function<void(Model&, const DeviceMesh&)>& plan,
                     const std::function<at::Tensor(Model&, const DeviceMesh&)>& step, const DryRunOptions& options = {}) {
  auto model = std::make_shared<std::optional<Model>>();
  return detail::dry_run_modules(
      [&, model]() -> std::shared_ptr<torch::nn::Module> {
        model->emplace(model_factory());
        return (**model).ptr();
      },
      mesh_shape, [&, model](const DeviceMesh& mesh) { plan(**model, mesh); },
      [&, model](const DeviceMesh& mesh) { return step(**model, mesh); }, options);
}

// A developer aid for adding meta kernels (src/ops/meta_kernels.cpp): runs `run` (a dry run) until it no
// longer stops at an op without a meta kernel. Each such op gets, for the rest of this call, a stand-in meta
// kernel that runs it on CPU zeros of the inputs' shapes (real memory and time: use small shapes) and
// returns meta tensors of the CPU results' shapes. Returns the ops, in the order the run met them; empty when
// `run` completes on the meta kernels alone. Other errors propagate.
std::vector<std::string> find_missing_meta_kernels(const std::function<void()>& run, int max_ops = 100);

}  // namespace dtensor
