// HF transformers' local and packed styles ("local_colwise", "local_rowwise", "packed_colwise",
// "packed_rowwise" in a tp_plan): the module computes on plain per-rank tensors. PyTorch's styles are in
// style.h.
//
// A packed weight (fused gate/up, or qkv) is made of parts whose sizes are in the proportions
// `packed_parts` ({1, 1}: two equal halves; {4, 1, 1}: GQA's q, k, v); each part is split on its own, so
// rank r holds [part0 chunk r; part1 chunk r; ...]. That is not a torch.chunk of the packed weight, which is
// why packed parameters are not DTensors (a Shard DTensor would claim a global tensor in the wrong order).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtensor/tp/style.h"

namespace dtensor {

struct LocalColwiseParallelOptions {
  std::vector<int64_t> packed_parts = {1};
};

// HF's "local_colwise" (packed_parts {1}) and "packed_colwise" (packed_parts {1, 1}): a Linear's output
// features (an Embedding's columns) are split as in ColwiseParallel, but the parameters stay plain local
// tensors and the output is this rank's local columns. Inputs: a DTensor is made Replicate and local; a
// plain tensor is taken as replicated.
struct LocalColwiseParallel : ParallelStyle, LocalColwiseParallelOptions {
  LocalColwiseParallel(LocalColwiseParallelOptions options = {}) : LocalColwiseParallelOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return packed_parts.size() > 1 ? "PackedColwiseParallel" : "LocalColwiseParallel"; }
};

struct LocalRowwiseParallelOptions {
  std::vector<int64_t> packed_parts = {1};
  std::optional<Placement> output_layouts = std::nullopt;  // nullopt: partial sums stay on each rank
  bool use_local_output = true;
};

// HF's "local_rowwise" (packed_parts {1}, no output_layouts: each rank's output is its partial sum, left for
// the model, e.g. a "gather" on the parent, to reduce) and "packed_rowwise" (packed_parts {1, 1}, output
// all-reduced to Replicate). Linear only; the weight's input features are split per part as in
// LocalColwiseParallel. A DTensor input is moved to this rank's local (packed) columns; a plain one is
// taken as already being them. A bias is added once, after the reduction; with the output left partial a
// bias would be counted once per rank, so it is refused.
struct LocalRowwiseParallel : ParallelStyle, LocalRowwiseParallelOptions {
  LocalRowwiseParallel(LocalRowwiseParallelOptions options = {}) : LocalRowwiseParallelOptions(std::move(options)) {}
  void validate(const torch::nn::Module&, const std::string&) const override;
  void apply(torch::nn::Module&, const std::string&, const DeviceMesh&, std::optional<int>) const override;
  std::string name() const override { return packed_parts.size() > 1 ? "PackedRowwiseParallel" : "LocalRowwiseParallel"; }
};

}  // namespace dtensor
