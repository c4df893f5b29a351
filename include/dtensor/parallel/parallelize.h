// parallelize_module and distribute_module (PyTorch's torch.distributed.tensor.parallel.api and
// torch.distributed.tensor.distribute_module).
//
//   dtensor::parallelize_module(model, tp_mesh, {
//       {"layers.*.attention.wq", dtensor::make_style<dtensor::ColwiseParallel>()},
//       {"layers.*.attention.wo", dtensor::make_style<dtensor::RowwiseParallel>()},
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
#include "dtensor/parallel/style.h"

namespace dtensor {

// A plan: module path -> style. Each dot-separated atom of a path is an fnmatch pattern ("layers.*.w?");
// "" is the module itself. Entries apply in order.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStylePtr>>;

// Applies `plan` to the submodules of `module` on a 1-D mesh (a mesh of more dims raises PyTorch's error:
// pass mesh["tp"]). A plan key that matches no module is an error naming the closest module paths.
void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelizePlan& plan,
                        std::optional<int> src_data_rank = 0);
// Applies one style to `module` itself.
void parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelStylePtr& style,
                        std::optional<int> src_data_rank = 0);

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
ParallelStylePtr style_from_string(const std::string& name);
ParallelizePlan plan_from_strings(const std::vector<std::pair<std::string, std::string>>& plan);

using PartitionFn = std::function<void(const std::string& path, torch::nn::Module& module, const DeviceMesh& mesh)>;
using InputFn = std::function<std::vector<at::Tensor>(torch::nn::Module&, std::vector<at::Tensor>, const DeviceMesh&)>;
using OutputFn = std::function<at::Tensor(torch::nn::Module&, at::Tensor, const DeviceMesh&)>;

// Distributes every parameter and buffer of `module` and its submodules: partition_fn(path, submodule,
// mesh) decides (it calls distribute_tensor + nn::replace_parameter as it likes); without one, or for
// what it leaves plain, everything is Replicate. input_fn / output_fn become the module's forward hooks.
void distribute_module(torch::nn::Module& module, const DeviceMesh& mesh, PartitionFn partition_fn = nullptr,
                       InputFn input_fn = nullptr, OutputFn output_fn = nullptr);

// Paths of the submodules of `module` ("" is the module itself) that `pattern` matches.
std::vector<std::string> match_module_paths(torch::nn::Module& module, const std::string& pattern);

}  // namespace dtensor
