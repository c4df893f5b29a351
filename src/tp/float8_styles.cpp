// The float8 parallel styles (include/dtensor/tp/float8_styles.h): the plain styles, with the Shard -> Replicate
// all-gathers of their activations (and Rowwise's backward all-gather) moving float8 bytes.
#include "dtensor/tp/float8_styles.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/chunking.h"
#include "dtensor/core/error.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/module_hooks.h"
#include "mesh/autograd_comm_scope.h"
#include "float8/float8_matmul.h"
#include "nn/forward_override.h"
#include "tp/style_support.h"

namespace dtensor {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Every rank's Shard(d) part of a tensor of `global` size along d, cast to `fp8` with one scale (the amax all-reduced
// over the group), all-gathered as bytes and dequantized into the local's dtype: the whole value.
at::Tensor gather_in_float8(const at::Tensor& local, int64_t d, int64_t global, const DeviceMesh& mesh, at::ScalarType fp8) {
  const at::Tensor amax = all_reduce(float8::abs_max(local).to(at::kFloat), ReduceOp::MAX, mesh, 0);
  const at::Tensor scale = float8::amax_to_scale(amax, fp8, /*power_of_two=*/false);
  const at::Tensor bytes = float8::cast(local, scale, fp8).contiguous().view(at::kByte);
  const at::Tensor gathered = all_gather(bytes, d, mesh, 0, chunk_sizes(global, mesh.size())).view(fp8);
  // Widened through float8::widen (PyTorch's .to() from float8 converts value by value), then the same division.
  return float8::widen(gathered, at::kFloat).div_(scale).to(local.scalar_type());
}

int64_t shard_dim(const at::Tensor& dt, const char* what) {
  const Placements& p = placements(dt);
  DTENSOR_CHECK(p.size() == 1 && p[0].is_shard(), "dtensor: ", what, " takes a Shard DTensor of a 1-D mesh, got ",
                to_string(p));
  return p[0].normalized(dt.dim()).dim();
}

// Shard(d) -> Replicate in e4m3 bytes; backward: the gradient to Shard(d) (Partial: reduce-scatter).
struct Float8AllGatherFn : torch::autograd::Function<Float8AllGatherFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dt) {
    const int64_t d = shard_dim(dt, "float8_all_gather");
    const DeviceMesh& mesh = device_mesh(dt);
    const at::Tensor whole = gather_in_float8(to_local(dt), d, dt.size(d), mesh, at::kFloat8_e4m3fn);
    ctx->saved_data["d"] = d;
    detail::save_comm_scope(ctx);
    return DTensor::from_local(whole, mesh, {Replicate()}, /*run_check=*/false, dt.sizes().vec());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto scope = detail::restore_comm_scope(ctx);
    DTENSOR_CHECK(is_dtensor(grads[0]), "dtensor: float8_all_gather: the gradient of its output is not a DTensor");
    return {redistribute(grads[0], {Shard(ctx->saved_data["d"].toInt())})};
  }
};

// Partial -> Shard(d) (reduce-scatter); backward: the Shard(d) gradient all-gathered in e5m2 bytes (Replicate).
struct ReduceScatterFloat8BackwardFn : torch::autograd::Function<ReduceScatterFloat8BackwardFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& dt, int64_t d) {
    detail::save_comm_scope(ctx);
    return redistribute(dt, {Shard(d)});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto scope = detail::restore_comm_scope(ctx);
    const at::Tensor& g = grads[0];
    DTENSOR_CHECK(is_dtensor(g), "dtensor: reduce_scatter_float8_backward: the gradient of its output is not a DTensor");
    const int64_t d = shard_dim(g, "reduce_scatter_float8_backward");
    const DeviceMesh& mesh = device_mesh(g);
    const at::Tensor whole = gather_in_float8(to_local(g), d, g.size(d), mesh, at::kFloat8_e5m2);
    return {DTensor::from_local(whole, mesh, {Replicate()}, /*run_check=*/false, g.sizes().vec()), at::Tensor()};
  }
};

void require_float8_linear(const torch::nn::Module& m, const std::string& style, const std::string& path) {
  DTENSOR_CHECK(is_float8_linear(m), "dtensor: ", style, " on '", path,
                "': the module is not a float8 Linear (convert_to_float8_training first; torchao's styles need a "
                "Float8Linear)");
}

// Input k arriving as `layout` (a plain tensor is this rank's part), Shard -> Replicate through the float8 all-gather.
at::Tensor gather_input(const at::Tensor& x, const DeviceMesh& mesh, const Placement& layout) {
  const at::Tensor dt = is_dtensor(x) ? x : DTensor::from_local(x, mesh, {layout});
  return placements(dt)[0].is_shard() ? float8_all_gather(dt) : dt;
}

}  // namespace

at::Tensor float8_all_gather(const at::Tensor& dtensor) { return Float8AllGatherFn::apply(dtensor); }

at::Tensor reduce_scatter_float8_backward(const at::Tensor& dtensor, int64_t d) {
  return ReduceScatterFloat8BackwardFn::apply(dtensor, d < 0 ? d + dtensor.dim() : d);
}

void Float8ColwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  ColwiseParallel::validate(m, path);
  require_float8_linear(m, name(), path);
}

void Float8ColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                  std::optional<int> src) const {
  validate(m, path);
  // The plain style with its input already Replicate; before its hook, a sharded input is gathered in float8.
  ColwiseParallel({.input_layouts = Replicate(), .output_layouts = output_layouts, .use_local_output = use_local_output})
      .apply(m, path, mesh, src);
  if (!input_layouts.is_shard()) return;
  const Placement layout = input_layouts;
  nn::detail::register_forward_pre_hook_first(m, [mesh, layout](torch::nn::Module&, nn::Args args, nn::KwArgs kwargs) {
    at::Tensor& x = detail::first_tensor_input(args, "Float8ColwiseParallel");
    x = gather_input(x, mesh, layout);
    return std::make_pair(std::move(args), std::move(kwargs));
  });
}

void Float8RowwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  RowwiseParallel::validate(m, path);
  require_float8_linear(m, name(), path);
}

void Float8RowwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                  std::optional<int> src) const {
  validate(m, path);
  const RowwiseParallelOptions& options = *this;
  if (!output_layouts.is_shard()) return RowwiseParallel(options).apply(m, path, mesh, src);
  // The plain style leaves its output Partial; after its hook, Partial -> Shard(d) with the float8 backward.
  RowwiseParallel({.input_layouts = input_layouts, .output_layouts = Partial(), .use_local_output = false})
      .apply(m, path, mesh, src);
  const Placement layout = output_layouts;
  const bool use_local = use_local_output;
  nn::register_forward_hook(m, nn::ForwardHook([layout, use_local](torch::nn::Module&, const nn::Args&, c10::IValue out) {
    const at::Tensor y = out.toTensor();
    const at::Tensor z = reduce_scatter_float8_backward(y, layout.normalized(y.dim()).dim());
    return c10::IValue(use_local ? to_local(z) : z);
  }));
}

void PrepareFloat8ModuleInput::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                     std::optional<int> src) const {
  validate(m, path);
  // The inputs going Shard -> Replicate arrive gathered in float8 (a hook before the plain style's, which then finds
  // them Replicate); the rest as PrepareModuleInput moves them.
  PrepareModuleInputOptions plain = *this;
  std::vector<std::pair<size_t, Placement>> gathered;
  for (size_t k = 0; k < input_layouts.size(); ++k) {
    const auto& from = input_layouts[k];
    const auto& to = k < desired_input_layouts.size() ? desired_input_layouts[k] : std::nullopt;
    if (from && from->is_shard() && to && to->is_replicate()) {
      gathered.emplace_back(k, *from);
      plain.input_layouts[k] = Replicate();
    }
  }
  PrepareModuleInput(plain).apply(m, path, mesh, src);
  if (gathered.empty()) return;
  const std::string where = name() + " for '" + path + "'";
  nn::detail::register_forward_pre_hook_first(m, [mesh, gathered, where](torch::nn::Module&, nn::Args args,
                                                                          nn::KwArgs kwargs) {
    for (const auto& [k, layout] : gathered) {
      DTENSOR_CHECK(k < args.size() && args[k].isTensor(), "dtensor: ", where, ": input ", k, " is not a tensor");
      args[k] = gather_input(args[k].toTensor(), mesh, layout);
    }
    return std::make_pair(std::move(args), std::move(kwargs));
  });
}

}  // namespace dtensor
