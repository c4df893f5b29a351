// Parallel styles (PyTorch's torch.distributed.tensor.parallel.style): how one module is parallelized:
// which placements its parameters get, and what its forward hooks do to inputs and outputs. Each style's
// apply is a partition_fn + input_fn + output_fn handed to distribute_module (distribute_module.h).
//
// Placement algebra where it is used:
//   ColwiseParallel   Linear weight Shard(0) (output features), bias Shard(0); Embedding weight Shard(1).
//                     Input -> Replicate (an all-gather if it came sharded); output Shard(-1), no comm.
//   RowwiseParallel   Linear weight Shard(1) (input features), bias Replicate; Embedding weight Shard(0).
//                     Input -> Shard(-1) (Linear) / Replicate (Embedding); the output is Partial:
//                     to Replicate = all-reduce, to Shard(d) = reduce-scatter.
//   SequenceParallel  parameters Replicate; input -> Shard(sequence_dim); output stays sharded.
//   ReplicateParallel parameters Replicate; inputs and outputs as they are.
// HF transformers' local and packed styles are in local_styles.h.
//
// Styles are values, as in PyTorch and torchtitan: each has an options struct (an aggregate with
// PyTorch's defaults) and a constructor taking it, and a plan entry takes any style value:
//   {"layers.*.feed_forward.w2", RowwiseParallel({.output_layouts = Shard(1)})},
//   {"norm", SequenceParallel()},
// A style also exposes its options as fields (style.use_local_output), since it derives from them.
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
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
  // Throws, naming the path, when the style cannot run on `mesh` (a TP degree it cannot split by). Checked
  // with validate, before any entry applies.
  virtual void validate_mesh(const std::string& /*path*/, const DeviceMesh& /*mesh*/) const {}
};
using ParallelStylePtr = std::shared_ptr<const ParallelStyle>;

// One layout per input (or output), as PyTorch's tuple, or one Placement for a single one. nullopt (None):
// leave that input alone. Empty: none given.
struct Layouts : std::vector<std::optional<Placement>> {
  Layouts() = default;
  Layouts(Placement layout) : vector{std::optional<Placement>(std::move(layout))} {}
  Layouts(std::initializer_list<std::optional<Placement>> layouts) : vector(layouts) {}
  Layouts(std::vector<std::optional<Placement>> layouts) : vector(std::move(layouts)) {}
};

struct ColwiseParallelOptions {
  Placement input_layouts = Replicate();
  Placement output_layouts = Shard(-1);
  bool use_local_output = true;
};

struct ColwiseParallel : ParallelStyle, ColwiseParallelOptions {
  ColwiseParallel(ColwiseParallelOptions options = {}) : ColwiseParallelOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "ColwiseParallel"; }
};

struct RowwiseParallelOptions {
  Placement input_layouts = Shard(-1);
  Placement output_layouts = Replicate();
  bool use_local_output = true;
};

struct RowwiseParallel : ParallelStyle, RowwiseParallelOptions {
  RowwiseParallel(RowwiseParallelOptions options = {}) : RowwiseParallelOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "RowwiseParallel"; }
};

struct SequenceParallelOptions {
  int64_t sequence_dim = 1;
  bool use_local_output = false;
};

struct SequenceParallel : ParallelStyle, SequenceParallelOptions {
  SequenceParallel(SequenceParallelOptions options = {}) : SequenceParallelOptions(std::move(options)) {}
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
// exactly that many positional inputs (PyTorch's rule); a layout on an input that is not a tensor is an
// error, None stays None. Keyword inputs are matched by name; a name without a layout is left alone. A
// plain tensor is taken as this rank's local part of its layout.
struct PrepareModuleInputOptions {
  Layouts input_layouts = {};
  Layouts desired_input_layouts = {};
  std::map<std::string, Placement> input_kwarg_layouts = {};
  std::map<std::string, Placement> desired_input_kwarg_layouts = {};
  bool use_local_output = false;
};

struct PrepareModuleInput : ParallelStyle, PrepareModuleInputOptions {
  PrepareModuleInput(PrepareModuleInputOptions options = {}) : PrepareModuleInputOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleInput"; }
};

// The output, or each element of a tuple (or list) of outputs, one layout per element (nullopt: leave it
// alone): a plain tensor is taken as this rank's local part of its output layout; it is moved to its
// desired layout. A DTensor is moved from whatever placement it has.
struct PrepareModuleOutputOptions {
  Layouts output_layouts = Replicate();
  Layouts desired_output_layouts = Replicate();
  bool use_local_output = true;
};

struct PrepareModuleOutput : ParallelStyle, PrepareModuleOutputOptions {
  PrepareModuleOutput(PrepareModuleOutputOptions options = {}) : PrepareModuleOutputOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleOutput"; }
};

// Both of the above on one module (use_local_input is PrepareModuleInput's use_local_output).
struct PrepareModuleInputOutputOptions {
  Layouts input_layouts = {};
  Layouts desired_input_layouts = {};
  std::map<std::string, Placement> input_kwarg_layouts = {};
  std::map<std::string, Placement> desired_input_kwarg_layouts = {};
  bool use_local_input = false;
  Layouts output_layouts = Replicate();
  Layouts desired_output_layouts = Replicate();
  bool use_local_output = true;
};

struct PrepareModuleInputOutput : ParallelStyle, PrepareModuleInputOutputOptions {
  PrepareModuleInputOutput(PrepareModuleInputOutputOptions options = {})
      : PrepareModuleInputOutputOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return "PrepareModuleInputOutput"; }

 private:
  PrepareModuleInput input_style() const;
  PrepareModuleOutput output_style() const;
};

// A plan entry's style: any style value (copied into a shared, immutable style), or a shared style.
//   ParallelizePlan plan = {{"w1", ColwiseParallel()}, {"w2", RowwiseParallel({.output_layouts = Shard(1)})}};
class ParallelStyleRef {
 public:
  ParallelStyleRef() = default;
  ParallelStyleRef(std::nullptr_t) {}
  template <typename Style, typename = std::enable_if_t<std::is_base_of_v<ParallelStyle, std::decay_t<Style>>>>
  ParallelStyleRef(Style&& style) : style_(std::make_shared<const std::decay_t<Style>>(std::forward<Style>(style))) {}
  template <typename Style, typename = std::enable_if_t<std::is_base_of_v<ParallelStyle, Style>>>
  ParallelStyleRef(std::shared_ptr<Style> style) : style_(std::move(style)) {}

  const ParallelStyle& operator*() const { return *style_; }
  const ParallelStyle* operator->() const { return style_.get(); }
  explicit operator bool() const { return style_ != nullptr; }
  const ParallelStylePtr& ptr() const { return style_; }

 private:
  ParallelStylePtr style_;
};

// The older spelling of a shared style, kept so that existing plans compile: make_style<ColwiseParallel>()
// is ColwiseParallel(); make_style(style) shares a copy of `style`.
template <typename Style>
ParallelStylePtr make_style(Style style = {}) {
  return ParallelStyleRef(std::move(style)).ptr();
}

}  // namespace dtensor
