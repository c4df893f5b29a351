// Calling a parallelized model made of LibTorch's own layers: plain tensors in, plain tensors out.
//
// LibTorch's forwards are not virtual, so a stock model (torch::nn::Linear, MultiheadAttention,
// TransformerEncoderLayer, Sequential, a module of yours holding them) runs no hooks. After parallelize_module
// its parameters are DTensors, and every op of its forward propagates from them:
//   Linear under Colwise   weight Shard(0) : Replicate x -> Shard(-1) y          (no communication)
//   Linear under Rowwise   weight Shard(1) : Shard(-1) x -> Partial y            (reduced where an op needs it)
//   MultiheadAttention     in_proj _StridedShard(0, 3): each rank's heads        (pairwise.h)
// What PyTorch's hooks do at the root module, Parallelized does around the call: the plain tensor arguments
// become DTensors (input_layouts; Replicate: the whole tensor on every rank) and the tensor output, or each
// tensor of a tuple, is moved to output_layouts and made local:
//
//   torch::nn::Sequential mlp(torch::nn::Linear(8, 16), torch::nn::ReLU(), torch::nn::Linear(16, 8));
//   dtensor::parallelize_module(*mlp, tp_mesh, dtensor::PairwiseParallel());
//   dtensor::Parallelized tp_mlp(mlp);    // the mesh of its DTensor parameters
//   at::Tensor y = tp_mlp(x);             // mlp's single-device output; y.backward() reaches every shard
//
// Arguments that are not tensors pass through as they are. While the forward runs, plain tensors the model
// makes itself (a mask, a constant) count as replicated (ImplicitReplicationGuard). The model may also be
// called directly under an ImplicitReplicationGuard: it then returns DTensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <tuple>
#include <type_traits>
#include <utility>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/tensor/placement.h"

namespace dtensor {

struct ParallelizedOptions {
  Placement input_layouts = Replicate();   // of every tensor argument (a plain tensor is this rank's part)
  Placement output_layouts = Replicate();  // of every tensor output
  bool use_local_output = true;
};

namespace detail {
// A plain tensor argument as a DTensor of `layout` (undefined stays undefined, a DTensor stays as it is).
at::Tensor parallelized_input(const at::Tensor& x, const DeviceMesh& mesh, const Placement& layout);
// A tensor output moved to `layout` (a DTensor), made local when asked.
at::Tensor parallelized_output(const at::Tensor& y, const DeviceMesh& mesh, const Placement& layout, bool use_local);
// The mesh of the first DTensor parameter of `module`; throws naming the module when it has none.
DeviceMesh mesh_of_parameters(const torch::nn::Module& module);
}  // namespace detail

template <typename Holder>
class Parallelized {
 public:
  // `module` is a ModuleHolder (torch::nn::Sequential, a TORCH_MODULE of yours) or a std::shared_ptr to one.
  explicit Parallelized(Holder module, ParallelizedOptions options = {})
      : module_(std::move(module)), mesh_(detail::mesh_of_parameters(*module_)), options_(std::move(options)) {}
  Parallelized(Holder module, DeviceMesh mesh, ParallelizedOptions options = {})
      : module_(std::move(module)), mesh_(std::move(mesh)), options_(std::move(options)) {}

  template <typename... Args>
  auto forward(Args&&... args) {
    ImplicitReplicationGuard implicit;
    return output(module_->forward(input(std::forward<Args>(args))...));
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  Holder& module() { return module_; }  // its forward gives DTensors (under an ImplicitReplicationGuard)
  const DeviceMesh& mesh() const { return mesh_; }

 private:
  template <typename T>
  decltype(auto) input(T&& value) {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      return detail::parallelized_input(value, mesh_, options_.input_layouts);
    } else {
      return std::forward<T>(value);
    }
  }
  at::Tensor output(const at::Tensor& y) {
    return detail::parallelized_output(y, mesh_, options_.output_layouts, options_.use_local_output);
  }
  template <typename... Ts>
  std::tuple<Ts...> output(std::tuple<Ts...> outputs) {
    return std::apply([this](auto&&... each) { return std::tuple<Ts...>(output_element(std::move(each))...); },
                      std::move(outputs));
  }
  template <typename T>
  T output_element(T value) {
    if constexpr (std::is_same_v<T, at::Tensor>) return output(value);
    else return value;
  }

  Holder module_;
  DeviceMesh mesh_;
  ParallelizedOptions options_;
};

}  // namespace dtensor
