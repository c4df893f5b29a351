// parallelize_module (PyTorch's torch.distributed.tensor.parallel.api): a plan of module path -> style.
//
//   dtensor::parallelize_module(model, tp_mesh, {
//       {"tok_embeddings", RowwiseParallel({.input_layouts = Replicate(), .output_layouts = Shard(1)})},
//       {"layers.*.attention.wq", ColwiseParallel({.use_local_output = false})},
//       {"layers.*.feed_forward.w2", RowwiseParallel({.output_layouts = Shard(1)})},
//       {"norm", SequenceParallel()},
//   });
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tp/distribute_module.h"
#include "dtensor/tp/local_styles.h"
#include "dtensor/tp/moe_styles.h"
#include "dtensor/tp/pairwise.h"
#include "dtensor/tp/parallelized.h"
#include "dtensor/tp/style.h"

namespace dtensor {

// A plan: module path -> style. Each dot-separated atom of a path is an fnmatch pattern ("layers.*.w?");
// "" is the module itself. Entries apply in order. A style is any style value (ParallelStyleRef).
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyleRef>>;

// Applies `plan` to the submodules of `module` on a 1-D mesh (a mesh of more dims raises PyTorch's error:
// pass mesh["tp"]). A plan key that matches no module is an error naming the closest module paths.
void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        std::optional<int> src_data_rank = 0);
// Applies one style to `module` itself (the RFC's parallelize_module(module, mesh, PairwiseParallel())).
void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelStyleRef& style,
                        std::optional<int> src_data_rank = 0);

// The RFC's tp_mesh_dim: on an N-D mesh, tensor parallelism runs along mesh dim `dim` (this rank's 1-D slice
// of it, DeviceMesh::submesh); the same as passing that slice (mesh["tp"]) to the forms above.
//   parallelize_module(*model, mesh_2d, PairwiseParallel(), TpMeshDim{1});
struct TpMeshDim {
  int64_t dim = 0;
};
void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan, TpMeshDim tp_mesh_dim,
                        std::optional<int> src_data_rank = 0);
void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelStyleRef& style,
                        TpMeshDim tp_mesh_dim, std::optional<int> src_data_rank = 0);

// LibTorch's own layers (torch::nn::Linear, Embedding, LayerNorm, Dropout, MultiheadAttention and the
// modules built of them) take ColwiseParallel, RowwiseParallel and PairwiseParallel: their parameters become
// DTensors and their forwards, which run no hooks, propagate from them. Once any does, every parameter of
// `module` still plain becomes a Replicate DTensor, so that the whole forward runs on DTensors; call it
// through Parallelized (parallelized.h) for plain tensors in and out.

// HF transformers' string plans:
//   "colwise", "rowwise"            ColwiseParallel(), RowwiseParallel()
//   "colwise_rep", "rowwise_rep"    ColwiseParallel(output_layouts = Replicate), RowwiseParallel(input_layouts = Replicate)
//   "sequence_parallel"             SequenceParallel()
//   "replicate"                     ReplicateParallel(): parameters replicated, inputs and outputs untouched
//   "gather"                        PrepareModuleOutput(Partial -> Replicate): the output, a partial sum on
//                                   each rank (or a DTensor of any placement), all-reduced and made local
//   "local_colwise", "local_rowwise"  LocalColwiseParallel(), LocalRowwiseParallel(): plain local shards,
//                                   no communication (the rowwise output stays a partial sum)
//   "packed_colwise", "packed_rowwise"  the same for fused weights of two equal parts (gate/up); the
//                                   packed rowwise output is all-reduced to Replicate
//   "moe_tp_experts"                MoeTensorParallel(): a mixture of experts' 3-D gate_up_proj / down_proj split
//                                   by intermediate features, the output all-reduced (transformers 5's)
// transformers 4.x's "local" and "local_packed_rowwise" (for Llama 4's transposed experts, dropped by
// transformers 5) are refused with an error naming the replacement.
ParallelStylePtr style_from_string(const std::string& name);
ParallelizePlan plan_from_strings(const std::vector<std::pair<std::string, std::string>>& plan);

// Paths of the submodules of `module` ("" is the module itself) that `pattern` matches.
std::vector<std::string> match_module_paths(torch::nn::Module& module, const std::string& pattern);

}  // namespace dtensor
