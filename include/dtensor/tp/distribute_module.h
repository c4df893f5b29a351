// distribute_module (PyTorch's torch.distributed.tensor.distribute_module): the mechanism every parallel
// style is built on. A style is three functions handed to it:
//   partition_fn(path, submodule, mesh)   turns parameters into DTensors (distribute_tensor +
//                                         nn::replace_parameter), for the module and each submodule;
//   input_fn(module, args, kwargs, mesh)  a forward pre-hook: moves the inputs to the layouts forward needs;
//   output_fn(module, output, mesh)       a forward hook: moves the output to the layout the caller wants.
// Inputs and output are boxed (nn::Args, nn::KwArgs, c10::IValue; see module_hooks.h): a function changes
// the tensors it has a layout for and passes ints, bools, None and other tuple elements through.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>

#include <torch/nn/module.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/nn/parameter_replacement.h"

namespace dtensor {

using PartitionFn = std::function<void(const std::string& path, torch::nn::Module& module, const DeviceMesh& mesh)>;
using InputFn =
    std::function<std::pair<nn::Args, nn::KwArgs>(torch::nn::Module& module, nn::Args args, nn::KwArgs kwargs,
                                                  const DeviceMesh& mesh)>;
using OutputFn = std::function<c10::IValue(torch::nn::Module& module, c10::IValue output, const DeviceMesh& mesh)>;

// Runs partition_fn on `module` and every submodule (path "" is `module`), then makes every parameter and
// buffer still a plain tensor a DTensor replicated on every mesh dim (the values of rank src_data_rank along
// each mesh dim; nullopt: each rank's own), as PyTorch does. Then registers input_fn / output_fn
// (register_module_io) and links the module's hooks to those of its submodules (nn::link_enclosing_hooks).
void distribute_module(torch::nn::Module& module, const DeviceMesh& mesh, PartitionFn partition_fn = nullptr,
                       InputFn input_fn = nullptr, OutputFn output_fn = nullptr,
                       std::optional<int> src_data_rank = 0);

// distribute_module's hooks alone: for styles that leave parameters as they are (PyTorch's
// PrepareModuleInput / PrepareModuleOutput register their hooks without distribute_module's
// replication; HF's local styles keep plain local shards).
void register_module_io(torch::nn::Module& module, const DeviceMesh& mesh, InputFn input_fn, OutputFn output_fn);

}  // namespace dtensor
