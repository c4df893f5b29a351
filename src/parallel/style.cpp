#include "dtensor/parallel/style.h"
#include "dtensor/error.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <stdexcept>

#include "dtensor/parallel/layers.h"
#include "dtensor/parallel/module_hooks.h"
#include "dtensor/tensor/dtensor.h"
#include "parallel/distribute_params.h"

namespace dtensor {
namespace {

using detail::distribute_params;

std::string not_applicable(const std::string& style, const std::string& applies_to, const std::string& path,
                           const torch::nn::Module& m) {
  return "dtensor: " + style + " applies to " + applies_to + ", but '" + path + "' is a " + m.name();
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
  if (mesh.ndim() != 1) throw dtensor::Error("dtensor: " + style + " needs a 1-D mesh");
}

// PrepareModuleInput's checks (PyTorch's asserts, with the path).
void check_input_layouts(const std::string& style, const std::string& path, const std::vector<std::optional<Placement>>& in,
                         const std::vector<std::optional<Placement>>& desired,
                         const std::map<std::string, Placement>& kw_in, const std::map<std::string, Placement>& kw_desired) {
  if (in.size() != desired.size()) {
    throw dtensor::Error("dtensor: " + style + " for '" + path + "': input_layouts has " +
                                std::to_string(in.size()) + " entries but desired_input_layouts has " +
                                std::to_string(desired.size()) + "; they must have the same length");
  }
  for (size_t k = 0; k < in.size(); ++k) {
    if (!in[k] && desired[k]) {
      throw dtensor::Error("dtensor: " + style + " for '" + path + "': input " + std::to_string(k) +
                                  " has a desired layout " + desired[k]->to_string() + " but no input layout");
    }
  }
  for (const auto& [name, p] : kw_desired) {
    if (!kw_in.contains(name)) {
      throw dtensor::Error("dtensor: " + style + " for '" + path + "': keyword input '" + name +
                                  "' has a desired layout " + p.to_string() + " but no input_kwarg_layouts entry");
    }
  }
}

// PrepareModuleInput's pre-hook.
void register_input_hook(torch::nn::Module& m, const std::string& style, const std::string& path,
                         const DeviceMesh& mesh, const std::vector<std::optional<Placement>>& in,
                         const std::vector<std::optional<Placement>>& desired, const std::map<std::string, Placement>& kw_in,
                         const std::map<std::string, Placement>& kw_desired, bool use_local) {
  if (in.empty() && kw_in.empty()) return;
  nn::register_forward_pre_hook_with_kwargs(m, [=](torch::nn::Module&, nn::Tensors args, nn::Kwargs kwargs) {
    auto prepare = [&](at::Tensor& x, const Placement& layout, const Placement& want) {
      if (!x.defined()) return;  // None stays None
      x = prepare_input(x, mesh, layout, want);
      if (use_local) x = to_local(x);
    };
    if (!in.empty()) {
      if (args.size() != in.size()) {
        throw dtensor::Error("dtensor: " + style + " for '" + path + "': the module got " +
                                    std::to_string(args.size()) + " positional inputs but input_layouts has " +
                                    std::to_string(in.size()) + " (module inputs and input_layouts should have same length)");
      }
      for (size_t k = 0; k < args.size(); ++k) {
        if (in[k]) prepare(args[k], *in[k], desired[k].value_or(*in[k]));
      }
    }
    for (auto& [name, x] : kwargs) {
      auto it = kw_in.find(name);
      if (it == kw_in.end()) continue;
      auto want = kw_desired.find(name);
      prepare(x, it->second, want == kw_desired.end() ? it->second : want->second);
    }
    return std::make_pair(std::move(args), std::move(kwargs));
  });
}

void register_output_hook(torch::nn::Module& m, const DeviceMesh& mesh, Placement layout, Placement desired,
                          bool use_local) {
  nn::register_forward_hook(m, [=](torch::nn::Module&, const nn::Tensors&, at::Tensor y) {
    at::Tensor dt = is_dtensor(y) ? y : DTensor::from_local(y, mesh, {layout});
    return prepare_output(dt, mesh, desired, use_local);
  });
}

// Local styles: the parameter `name` (if present) becomes this rank's plain slice of dim `dim`, packed per
// `parts`. The source rank's values are the truth (broadcast first), as for distribute_tensor.
void localize_param(torch::nn::Module& m, const std::string& name, int64_t dim, const std::vector<int64_t>& parts,
                    const DeviceMesh& mesh, std::optional<int> src, const std::string& what) {
  auto params = m.named_parameters(/*recurse=*/false);
  if (!params.contains(name) || !params[name].defined()) return;
  const at::Tensor& old = params[name];
  at::Tensor full = src ? to_local(distribute_tensor(old.detach(), mesh, {Replicate()}, src)) : old.detach();
  at::Tensor local = detail::packed_slice(full, dim, parts, mesh, what + " '" + name + "'").contiguous();
  local.set_requires_grad(old.requires_grad());
  nn::replace_parameter(m, name, local);
}

// A style's hooks only run in the forward of a hookable module (rule 1 in module_hooks.h): torch::nn's own
// layers have none, so a style on one of them would do nothing at run time. Refused up front.
void require_hookable(const torch::nn::Module& m, const std::string& style, const std::string& path) {
  auto plain = [&](auto* torch_layer, auto* ours, const char* use) {
    if (torch_layer && !ours) {
      throw dtensor::Error("dtensor: " + style + " on '" + path + "': " + m.name() +
                                  " has no forward hooks, so the style could not prepare its inputs and outputs; use " +
                                  use + " (dtensor/parallel/layers.h), which has torch::nn's options and numerics");
    }
  };
  plain(dynamic_cast<const torch::nn::LinearImpl*>(&m), dynamic_cast<const nn::LinearImpl*>(&m), "dtensor::nn::Linear");
  plain(dynamic_cast<const torch::nn::EmbeddingImpl*>(&m), dynamic_cast<const nn::EmbeddingImpl*>(&m), "dtensor::nn::Embedding");
  plain(dynamic_cast<const torch::nn::LayerNormImpl*>(&m), dynamic_cast<const nn::LayerNormImpl*>(&m), "dtensor::nn::LayerNorm");
  plain(dynamic_cast<const torch::nn::DropoutImpl*>(&m), dynamic_cast<const nn::DropoutImpl*>(&m), "dtensor::nn::Dropout");
}

bool is_linear(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; }
bool is_embedding(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::EmbeddingImpl*>(&m) != nullptr; }

}  // namespace

void ColwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  if (!is_linear(m) && !is_embedding(m)) throw dtensor::Error(not_applicable(name(), "Linear and Embedding", path, m));
  require_hookable(m, name(), path);  // after the type check, whose error comes first
}

void ColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                            std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  if (is_linear(m)) {
    distribute_params(m, mesh, {{"weight", {Shard(0)}}, {"bias", {Shard(0)}}}, src);
  } else {
    distribute_params(m, mesh, {{"weight", {Shard(1)}}}, src);
  }
  register_layer_hooks(m, mesh, input_layouts, Replicate(), output_layouts, use_local_output);
}

void RowwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  if (!is_linear(m) && !is_embedding(m)) throw dtensor::Error(not_applicable(name(), "Linear and Embedding", path, m));
  require_hookable(m, name(), path);  // after the type check, whose error comes first
}

void RowwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                            std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  Placement desired_in = Shard(-1);
  if (is_linear(m)) {
    distribute_params(m, mesh, {{"weight", {Shard(1)}}, {"bias", {Replicate()}}}, src);
  } else {
    distribute_params(m, mesh, {{"weight", {Shard(0)}}}, src);
    desired_in = Replicate();
  }
  // The output is Partial: to Replicate = all-reduce, to Shard(d) = reduce-scatter.
  register_layer_hooks(m, mesh, input_layouts, desired_in, output_layouts, use_local_output);
}

void SequenceParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
}

void SequenceParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                             std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  detail::replicate_params(m, mesh, src, /*buffers=*/false);
  const Placement seq = Shard(sequence_dim);
  nn::register_forward_pre_hook(m, [=](torch::nn::Module&, nn::Tensors xs) {
    xs[0] = prepare_input(xs[0], mesh, seq, seq);
    return xs;
  });
  const bool local = use_local_output;
  nn::register_forward_hook(m, [=](torch::nn::Module&, const nn::Tensors&, at::Tensor y) {
    return local && is_dtensor(y) ? to_local(y) : y;
  });
}

void ReplicateParallel::apply(torch::nn::Module& m, const std::string&, const DeviceMesh& mesh,
                              std::optional<int> src) const {
  require_1d(mesh, name());
  detail::replicate_params(m, mesh, src, /*buffers=*/false);
}

void PrepareModuleInput::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
  check_input_layouts(name(), path, input_layouts, desired_input_layouts, input_kwarg_layouts, desired_input_kwarg_layouts);
}

void PrepareModuleInput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                               std::optional<int>) const {
  require_1d(mesh, name());
  validate(m, path);
  register_input_hook(m, name(), path, mesh, input_layouts, desired_input_layouts, input_kwarg_layouts,
                      desired_input_kwarg_layouts, use_local_output);
}

void PrepareModuleOutput::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
}

void PrepareModuleOutput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                std::optional<int>) const {
  require_1d(mesh, name());
  validate(m, path);
  register_output_hook(m, mesh, output_layouts, desired_output_layouts, use_local_output);
}

void PrepareModuleInputOutput::validate(const torch::nn::Module& m, const std::string& path) const {
  require_hookable(m, name(), path);
  check_input_layouts(name(), path, input_layouts, desired_input_layouts, input_kwarg_layouts, desired_input_kwarg_layouts);
}

PrepareModuleInput PrepareModuleInputOutput::input_style() const {
  PrepareModuleInput in;
  in.input_layouts = input_layouts;
  in.desired_input_layouts = desired_input_layouts;
  in.input_kwarg_layouts = input_kwarg_layouts;
  in.desired_input_kwarg_layouts = desired_input_kwarg_layouts;
  in.use_local_output = use_local_input;
  return in;
}

PrepareModuleOutput PrepareModuleInputOutput::output_style() const {
  PrepareModuleOutput out;
  out.output_layouts = output_layouts;
  out.desired_output_layouts = desired_output_layouts;
  out.use_local_output = use_local_output;
  return out;
}

void PrepareModuleInputOutput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                     std::optional<int> src) const {
  validate(m, path);  // with this style's name in the errors
  input_style().apply(m, path, mesh, src);
  output_style().apply(m, path, mesh, src);
}

void LocalColwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  if (!is_linear(m) && !(is_embedding(m) && packed_parts.size() == 1)) {
    throw dtensor::Error(
        not_applicable(name(), packed_parts.size() == 1 ? "Linear and Embedding" : "Linear", path, m));
  }
  const auto& weight = m.named_parameters(/*recurse=*/false)["weight"];
  detail::packed_indices(weight.size(is_linear(m) ? 0 : 1), packed_parts, 1, 0, name() + " on '" + path + "'");
  require_hookable(m, name(), path);  // after the type check, whose error comes first
}

void LocalColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                 std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  const std::string what = name() + " on '" + path + "'";
  if (is_linear(m)) {
    localize_param(m, "weight", 0, packed_parts, mesh, src, what);
    localize_param(m, "bias", 0, packed_parts, mesh, src, what);
  } else {
    localize_param(m, "weight", 1, packed_parts, mesh, src, what);
  }
  // Every rank needs the whole input: a DTensor is made Replicate and local; a plain tensor is taken as is.
  nn::register_forward_pre_hook(m, [mesh](torch::nn::Module&, nn::Tensors xs) {
    if (is_dtensor(xs[0])) xs[0] = to_local(redistribute(xs[0], mesh, {Replicate()}));
    return xs;
  });
}

void LocalRowwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&m);
  if (!linear) throw dtensor::Error(not_applicable(name(), "Linear", path, m));
  if (linear->bias.defined() && !output_layouts) {
    throw dtensor::Error("dtensor: " + name() + " on '" + path +
                                "': the output is left a partial sum on each rank, so a bias would be added once per "
                                "rank; give output_layouts (e.g. Replicate()) or use a Linear without bias");
  }
  detail::packed_indices(linear->weight.size(1), packed_parts, 1, 0, name() + " on '" + path + "'");
  require_hookable(m, name(), path);  // after the type check, whose error comes first
}

void LocalRowwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                 std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  auto& linear = dynamic_cast<torch::nn::LinearImpl&>(m);
  const bool has_bias = linear.bias.defined();
  localize_param(m, "weight", 1, packed_parts, mesh, src, name() + " on '" + path + "'");
  if (has_bias) {
    // The bias stays a registered (replicated, plain) parameter but leaves the Linear's forward: it is
    // added once, after the reduction.
    at::Tensor bias = to_local(distribute_tensor(linear.bias.detach(), mesh, {Replicate()}, src));
    bias.set_requires_grad(linear.bias.requires_grad());
    nn::replace_parameter(m, "bias", bias);
    linear.bias = at::Tensor();
  }
  const auto parts = packed_parts;
  // A DTensor input is moved to this rank's (packed) columns of the last dim; a plain one is taken as them.
  nn::register_forward_pre_hook(m, [mesh, parts](torch::nn::Module&, nn::Tensors xs) {
    if (!is_dtensor(xs[0])) return xs;
    if (parts.size() == 1) {
      xs[0] = to_local(redistribute(xs[0], mesh, {Shard(-1)}));
    } else {
      xs[0] = detail::packed_slice(to_local(redistribute(xs[0], mesh, {Replicate()})), -1, parts, mesh, "input");
    }
    return xs;
  });
  if (!output_layouts) return;
  const Placement out = *output_layouts;
  const bool local = use_local_output;
  // The output is this rank's partial sum: to Replicate = all-reduce, to Shard(d) = reduce-scatter.
  nn::register_forward_hook(m, [mesh, out, local, has_bias](torch::nn::Module& module, const nn::Tensors&, at::Tensor y) {
    at::Tensor dt = redistribute(DTensor::from_local(y, mesh, {Partial()}), mesh, {out});
    if (has_bias) {
      at::Tensor bias = module.named_parameters(/*recurse=*/false)["bias"];
      dt = dt + DTensor::from_local(bias, mesh, {Replicate()});
    }
    return local ? to_local(dt) : dt;
  });
}

}  // namespace dtensor
