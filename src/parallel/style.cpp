#include "dtensor/parallel/style.h"

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>

#include "dtensor/parallel/module_hooks.h"
#include "dtensor/tensor/dtensor.h"

namespace dtensor {
namespace {

std::string type_name(const torch::nn::Module& m) { return m.name(); }

// Re-creates each parameter named in `placements` as a DTensor (the source rank's values are the truth).
void distribute_params(torch::nn::Module& module, const DeviceMesh& mesh,
                       const std::vector<std::pair<std::string, Placement>>& placements, std::optional<int> src) {
  for (const auto& [name, p] : placements) {
    auto params = module.named_parameters(/*recurse=*/false);
    if (!params.contains(name)) continue;  // e.g. a Linear without bias
    const at::Tensor& old = params[name];
    if (!old.defined()) continue;
    at::Tensor dt = distribute_tensor(old.detach(), mesh, {p}, src);
    dt.set_requires_grad(old.requires_grad());
    nn::replace_parameter(module, name, dt);
  }
}

// An input as it arrives (a plain tensor is this rank's local part with `layout`) moved to `desired`.
at::Tensor prepare_input(const at::Tensor& x, const DeviceMesh& mesh, const Placement& layout, const Placement& desired) {
  at::Tensor dt = is_dtensor(x) ? x : DTensor::from_local(x, mesh, {layout});
  if (placements(dt)[0] != desired.normalized(dt.dim())) dt = redistribute(dt, mesh, {desired});
  return dt;
}

at::Tensor prepare_output(const at::Tensor& out, const DeviceMesh& mesh, const Placement& desired, bool use_local) {
  at::Tensor dt = out;
  if (is_dtensor(dt) && placements(dt)[0] != desired.normalized(dt.dim())) dt = redistribute(dt, mesh, {desired});
  return use_local && is_dtensor(dt) ? to_local(dt) : dt;
}

// Colwise / Rowwise: the first input arrives as `layout` and is moved to `desired`; the output is moved to
// `out` (and made local when asked).
void register_layer_hooks(torch::nn::Module& m, const DeviceMesh& mesh, Placement layout, Placement desired,
                          Placement out, bool use_local_output) {
  nn::register_forward_pre_hook(m, [=](torch::nn::Module&, nn::Tensors xs) {
    xs[0] = prepare_input(xs[0], mesh, layout, desired);
    return xs;
  });
  nn::register_forward_hook(m, [=](torch::nn::Module&, const nn::Tensors&, at::Tensor y) {
    return prepare_output(y, mesh, out, use_local_output);
  });
}

void require_1d(const DeviceMesh& mesh, const std::string& style) {
  if (mesh.ndim() != 1) throw std::invalid_argument("dtensor: " + style + " needs a 1-D mesh");
}

}  // namespace

void ColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                            std::optional<int> src) const {
  require_1d(mesh, name());
  if (dynamic_cast<torch::nn::LinearImpl*>(&m)) {
    distribute_params(m, mesh, {{"weight", Shard(0)}, {"bias", Shard(0)}}, src);
  } else if (dynamic_cast<torch::nn::EmbeddingImpl*>(&m)) {
    distribute_params(m, mesh, {{"weight", Shard(1)}}, src);
  } else {
    throw std::invalid_argument("dtensor: ColwiseParallel applies to Linear and Embedding, but '" + path + "' is a " +
                                type_name(m));
  }
  register_layer_hooks(m, mesh, input_layouts, Replicate(), output_layouts, use_local_output);
}

void RowwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                            std::optional<int> src) const {
  require_1d(mesh, name());
  Placement desired_in = Shard(-1);
  if (dynamic_cast<torch::nn::LinearImpl*>(&m)) {
    distribute_params(m, mesh, {{"weight", Shard(1)}, {"bias", Replicate()}}, src);
  } else if (dynamic_cast<torch::nn::EmbeddingImpl*>(&m)) {
    distribute_params(m, mesh, {{"weight", Shard(0)}}, src);
    desired_in = Replicate();
  } else {
    throw std::invalid_argument("dtensor: RowwiseParallel applies to Linear and Embedding, but '" + path + "' is a " +
                                type_name(m));
  }
  // The output is Partial: to Replicate = all-reduce, to Shard(d) = reduce-scatter.
  register_layer_hooks(m, mesh, input_layouts, desired_in, output_layouts, use_local_output);
}

void SequenceParallel::apply(torch::nn::Module& m, const std::string&, const DeviceMesh& mesh,
                             std::optional<int> src) const {
  require_1d(mesh, name());
  std::vector<std::pair<std::string, Placement>> params;
  for (const auto& item : m.named_parameters(/*recurse=*/false)) params.emplace_back(item.key(), Replicate());
  distribute_params(m, mesh, params, src);
  Placement seq = Shard(sequence_dim);
  DeviceMesh mesh_copy = mesh;
  bool local = use_local_output;
  nn::register_forward_pre_hook(m, [=](torch::nn::Module&, nn::Tensors xs) {
    xs[0] = prepare_input(xs[0], mesh_copy, seq, seq);
    return xs;
  });
  nn::register_forward_hook(m, [=](torch::nn::Module&, const nn::Tensors&, at::Tensor y) {
    return local && is_dtensor(y) ? to_local(y) : y;
  });
}

void PrepareModuleInput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                               std::optional<int>) const {
  require_1d(mesh, name());
  if (input_layouts.size() != desired_input_layouts.size()) {
    throw std::invalid_argument("dtensor: PrepareModuleInput for '" + path +
                                "' needs as many desired_input_layouts as input_layouts");
  }
  auto in = input_layouts, desired = desired_input_layouts;
  DeviceMesh mesh_copy = mesh;
  bool local = use_local_output;
  nn::register_forward_pre_hook(m, [=](torch::nn::Module&, nn::Tensors xs) {
    for (size_t k = 0; k < xs.size() && k < in.size(); ++k) {
      if (!in[k] || !xs[k].defined()) continue;
      xs[k] = prepare_input(xs[k], mesh_copy, *in[k], desired[k].value_or(*in[k]));
      if (local) xs[k] = to_local(xs[k]);
    }
    return xs;
  });
}

void PrepareModuleOutput::apply(torch::nn::Module& m, const std::string&, const DeviceMesh& mesh,
                                std::optional<int>) const {
  require_1d(mesh, name());
  Placement layout = output_layouts, desired = desired_output_layouts;
  DeviceMesh mesh_copy = mesh;
  bool local = use_local_output;
  nn::register_forward_hook(m, [=](torch::nn::Module&, const nn::Tensors&, at::Tensor y) {
    at::Tensor dt = is_dtensor(y) ? y : DTensor::from_local(y, mesh_copy, {layout});
    return prepare_output(dt, mesh_copy, desired, local);
  });
}

}  // namespace dtensor
