// Parallel styles (PyTorch's torch.distributed.tensor.parallel.style): how one module is parallelized:
// which placements its parameters get, and what its forward hooks do to inputs and outputs.
//
// Placement algebra where it is used:
//   ColwiseParallel   Linear weight Shard(0) (output features), bias Shard(0); Embedding weight Shard(1).
//                     Input -> Replicate (an all-gather if it came sharded); output Shard(-1), no comm.
//   RowwiseParallel   Linear weight Shard(1) (input features), bias Replicate; Embedding weight Shard(0).
//                     Input -> Shard(-1) (Linear) / Replicate (Embedding); the output is Partial:
//                     to Replicate = all-reduce, to Shard(d) = reduce-scatter.
//   SequenceParallel  parameters Replicate; input -> Shard(sequence_dim); output stays sharded.
//   ReplicateParallel parameters Replicate; inputs and outputs as they are.
//   Local*Parallel    HF transformers' local_* and packed_* styles: parameters are plain per-rank tensors
//                     (see below), the module computes on local tensors.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tensor/placement.h"

namespace dtensor {

class ParallelStyle {
 public:
  virtual ~ParallelStyle() = default;
  // Parallelizes `module` (found at `path` in the model) over the 1-D `mesh`. Throws naming the path and the
  // module type when the style does not apply to it.
  virtual void apply(torch::nn::Module& module, const std::string& path, const DeviceMesh& mesh,
                     std::optional<int> src_data_rank) const = 0;
  virtual std::string name() const = 0;
  // Throws, naming the path, when the style cannot apply to `module`. parallelize_module validates every
  // entry of a plan before applying any, so a bad plan leaves the model untouched.
  virtual void validate(const torch::nn::Module& /*module*/, const std::string& /*path*/) const {}
};
using ParallelStylePtr = std::shared_ptr<const ParallelStyle>;

struct ColwiseParallel : ParallelStyle {
  Placement input_layouts = Replicate();
  Placement output_layouts = Shard(-1);
  bool use_local_output = true;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "ColwiseParallel"; }
};

struct RowwiseParallel : ParallelStyle {
  Placement input_layouts = Shard(-1);
  Placement output_layouts = Replicate();
  bool use_local_output = true;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "RowwiseParallel"; }
};

struct SequenceParallel : ParallelStyle {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "SequenceParallel"; }
};

struct ReplicateParallel : ParallelStyle {
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "ReplicateParallel"; }
};

// Inputs: for each positional input, its layout as it arrives (nullopt: leave the input alone) and the
// layout the module needs (nullopt: keep the arriving layout). With input_layouts given, a forward must get
// exactly that many positional inputs (PyTorch's rule). Keyword inputs (nn::Kwargs) are matched by name;
// a name without a layout is left alone. A plain tensor is taken as this rank's local part of `layout`.
struct PrepareModuleInput : ParallelStyle {
  std::vector<std::optional<Placement>> input_layouts;
  std::vector<std::optional<Placement>> desired_input_layouts;
  std::map<std::string, Placement> input_kwarg_layouts;
  std::map<std::string, Placement> desired_input_kwarg_layouts;
  bool use_local_output = false;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleInput"; }
};

// The output: a plain tensor is taken as this rank's local part of `output_layouts`; it is moved to
// desired_output_layouts.
struct PrepareModuleOutput : ParallelStyle {
  Placement output_layouts = Replicate();
  Placement desired_output_layouts = Replicate();
  bool use_local_output = true;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleOutput"; }
};

// Both of the above on one module (use_local_input is PrepareModuleInput's use_local_output).
struct PrepareModuleInputOutput : ParallelStyle {
  std::vector<std::optional<Placement>> input_layouts;
  std::vector<std::optional<Placement>> desired_input_layouts;
  std::map<std::string, Placement> input_kwarg_layouts;
  std::map<std::string, Placement> desired_input_kwarg_layouts;
  bool use_local_input = false;
  Placement output_layouts = Replicate();
  Placement desired_output_layouts = Replicate();
  bool use_local_output = true;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleInputOutput"; }

 private:
  PrepareModuleInput input_style() const;
  PrepareModuleOutput output_style() const;
};

// HF transformers' "local_colwise" (packed_parts {1}) and "packed_colwise" (packed_parts {1, 1}): a Linear's
// output features (an Embedding's columns) are split as in ColwiseParallel, but the parameters stay plain
// local tensors and the output is this rank's local columns. A packed weight (fused gate/up, or qkv) is
// made of parts whose sizes are in the proportions `packed_parts` ({1, 1}: two equal halves; {4, 1, 1}:
// GQA's q, k, v); each part is split on its own, so rank r holds [part0 chunk r; part1 chunk r; ...]. That
// is not a torch.chunk of the packed weight, which is why packed parameters are not DTensors (a Shard
// DTensor would claim a global tensor in the wrong order). Inputs: a DTensor is made Replicate and local;
// a plain tensor is taken as replicated.
struct LocalColwiseParallel : ParallelStyle {
  std::vector<int64_t> packed_parts = {1};
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return packed_parts.size() > 1 ? "PackedColwiseParallel" : "LocalColwiseParallel"; }
};

// HF's "local_rowwise" (packed_parts {1}, no output_layouts: each rank's output is its partial sum, left for
// the model, e.g. a "gather" on the parent, to reduce) and "packed_rowwise" (packed_parts {1, 1}, output
// all-reduced to Replicate). Linear only; the weight's input features are split per part as in
// LocalColwiseParallel. A DTensor input is moved to this rank's local (packed) columns; a plain one is
// taken as already being them. A bias is added once, after the reduction; with the output left partial a
// bias would be counted once per rank, so it is refused.
struct LocalRowwiseParallel : ParallelStyle {
  std::vector<int64_t> packed_parts = {1};
  std::optional<Placement> output_layouts;  // nullopt: partial sums stay on each rank
  bool use_local_output = true;
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return packed_parts.size() > 1 ? "PackedRowwiseParallel" : "LocalRowwiseParallel"; }
};

// A shared style from a value: make_style<ColwiseParallel>() for the defaults, or
//   RowwiseParallel rowwise;  rowwise.output_layouts = Shard(1);  make_style(rowwise);
template <typename Style>
ParallelStylePtr make_style(Style style = {}) {
  return std::make_shared<const Style>(std::move(style));
}

}  // namespace dtensor
