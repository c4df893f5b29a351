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
#pragma once

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
};
using ParallelStylePtr = std::shared_ptr<const ParallelStyle>;

struct ColwiseParallel : ParallelStyle {
  Placement input_layouts = Replicate();
  Placement output_layouts = Shard(-1);
  bool use_local_output = true;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "ColwiseParallel"; }
};

struct RowwiseParallel : ParallelStyle {
  Placement input_layouts = Shard(-1);
  Placement output_layouts = Replicate();
  bool use_local_output = true;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "RowwiseParallel"; }
};

struct SequenceParallel : ParallelStyle {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "SequenceParallel"; }
};

// Inputs: for each positional input, its layout as it arrives (nullopt: leave the input alone) and the
// layout the module needs.
struct PrepareModuleInput : ParallelStyle {
  std::vector<std::optional<Placement>> input_layouts;
  std::vector<std::optional<Placement>> desired_input_layouts;
  bool use_local_output = false;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleInput"; }
};

struct PrepareModuleOutput : ParallelStyle {
  Placement output_layouts = Replicate();
  Placement desired_output_layouts = Replicate();
  bool use_local_output = true;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleOutput"; }
};

// Builders in PyTorch's keyword style: colwise(), rowwise({.output_layouts = Shard(1)}), ...
template <typename Style>
ParallelStylePtr make_style(Style style = {}) {
  return std::make_shared<const Style>(std::move(style));
}

}  // namespace dtensor
