// What the styles share (style.cpp: PyTorch's; local_styles.cpp: HF's): the checks that a style fits a
// module, and the moves of one input or output between layouts.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tensor/placement.h"

namespace dtensor::detail {

bool is_linear(const torch::nn::Module& m);
bool is_embedding(const torch::nn::Module& m);

// "dtensor: <style> applies to <applies_to>, but '<path>' is a <module type>".
std::string not_applicable(const std::string& style, const std::string& applies_to, const std::string& path,
                           const torch::nn::Module& m);
void require_1d(const DeviceMesh& mesh, const std::string& style);
// LibTorch's own Linear, Embedding, LayerNorm or Dropout (not dtensor::nn's hookable subclass): its forward is
// not virtual and runs no hooks. A style still places its parameters (DTensors, through which every op of its
// forward propagates); it cannot move the layer's inputs and outputs.
bool is_stock_layer(const torch::nn::Module& m);
// Styles that act only through hooks (SequenceParallel, PrepareModule*, HF's local styles) refuse a stock layer.
void require_hookable(const torch::nn::Module& m, const std::string& style, const std::string& path);
// Colwise / Rowwise on a stock layer: only layouts that propagation gives by itself (Replicate, Shard(-1),
// Partial); a sequence-parallel Shard(1) is refused, naming the hookable layer to use.
void require_stock_layouts(const torch::nn::Module& m, const std::string& style, const std::string& path,
                           const Placement& input_layout, const Placement& output_layout);

// An input as it arrives (a plain tensor is this rank's local part with `layout`) moved to `desired`. A plain
// tensor's global shape is its local shape times the mesh along a Shard dim (PyTorch's from_local: even
// shards), unless `sharded_size` gives that dim's global size, which a style knows from its module (a
// Rowwise Linear's in_features): then uneven shards (10 features over 4 ranks: 3, 3, 3, 1) work, and a local
// size that is not this rank's chunk of it is refused, naming `what`.
at::Tensor prepare_input(const at::Tensor& x, const DeviceMesh& mesh, const Placement& layout, const Placement& desired,
                         std::optional<int64_t> sharded_size = std::nullopt, const std::string& what = "");
// An output moved to `desired` (when it is a DTensor), made local when asked.
at::Tensor prepare_output(const at::Tensor& out, const DeviceMesh& mesh, const Placement& desired, bool use_local);
// A boxed input a style has a layout for: a tensor is prepared (and made local when asked), None stays None,
// anything else is PyTorch's error, naming `what`.
c10::IValue prepare_input_value(const c10::IValue& value, const DeviceMesh& mesh, const Placement& layout,
                                const Placement& desired, bool use_local, const std::string& what);
// The first positional input of a style's module, which must be a tensor.
at::Tensor& first_tensor_input(std::vector<c10::IValue>& args, const std::string& style);

}  // namespace dtensor::detail
