#include "tp/style_support.h"
#include "dtensor/core/error.h"

#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "dtensor/nn/layers.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/tensor/shard_layout.h"

namespace dtensor::detail {

bool is_linear(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::LinearImpl*>(&m) != nullptr; }
bool is_embedding(const torch::nn::Module& m) { return dynamic_cast<const torch::nn::EmbeddingImpl*>(&m) != nullptr; }

std::string not_applicable(const std::string& style, const std::string& applies_to, const std::string& path,
                           const torch::nn::Module& m) {
  return "dtensor: " + style + " applies to " + applies_to + ", but '" + path + "' is a " + m.name();
}

void require_1d(const DeviceMesh& mesh, const std::string& style) {
  DTENSOR_CHECK(mesh.ndim() == 1, "dtensor: ", style, " needs a 1-D mesh");
}

bool is_stock_layer(const torch::nn::Module& m) {
  auto stock = [&](auto* torch_layer, auto* ours) { return torch_layer != nullptr && ours == nullptr; };
  return stock(dynamic_cast<const torch::nn::LinearImpl*>(&m), dynamic_cast<const nn::LinearImpl*>(&m)) ||
         stock(dynamic_cast<const torch::nn::EmbeddingImpl*>(&m), dynamic_cast<const nn::EmbeddingImpl*>(&m)) ||
         stock(dynamic_cast<const torch::nn::LayerNormImpl*>(&m), dynamic_cast<const nn::LayerNormImpl*>(&m)) ||
         stock(dynamic_cast<const torch::nn::DropoutImpl*>(&m), dynamic_cast<const nn::DropoutImpl*>(&m));
}

namespace {

const char* hookable_layer_for(const torch::nn::Module& m) {
  if (dynamic_cast<const torch::nn::LinearImpl*>(&m)) return "dtensor::nn::Linear";
  if (dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) return "dtensor::nn::Embedding";
  if (dynamic_cast<const torch::nn::LayerNormImpl*>(&m)) return "dtensor::nn::LayerNorm";
  return "dtensor::nn::Dropout";
}

}  // namespace

void require_hookable(const torch::nn::Module& m, const std::string& style, const std::string& path) {
  DTENSOR_CHECK(!is_stock_layer(m), "dtensor: ", style, " on '", path, "': ", m.name(),
                " is LibTorch's own layer, whose forward runs no hooks, and ", style,
                " works only through its input and output hooks. Stock layers take ColwiseParallel, RowwiseParallel "
                "and PairwiseParallel, whose sharded parameters carry the parallelism; for ", style, " use ",
                hookable_layer_for(m), " (dtensor/nn/layers.h), which has torch::nn's options and numerics");
}

void require_stock_layouts(const torch::nn::Module& m, const std::string& style, const std::string& path,
                           const Placement& input_layout, const Placement& output_layout) {
  if (!is_stock_layer(m)) return;
  // On a stock layer, activations are global DTensors whose layouts follow from the parameters' (Replicate in,
  // Shard(-1) between a Colwise and a Rowwise, Partial out, reduced where a later op needs it). A layout of
  // another dim (sequence parallel's Shard(1)) needs a hook to move the activation there.
  auto fits = [](const Placement& p) { return !p.is_shard() || p.is_shard(-1); };
  for (const auto& [what, p] : {std::pair<const char*, const Placement&>{"input_layouts", input_layout},
                                std::pair<const char*, const Placement&>{"output_layouts", output_layout}}) {
    DTENSOR_CHECK(fits(p), "dtensor: ", style, " on '", path, "': ", what, " ", p.to_string(), " cannot apply to ",
                  m.name(), ", LibTorch's own layer, whose forward runs no hooks to move its activations: on it, "
                  "activations keep the layouts the sharded parameters give (Replicate, Shard(-1), Partial). Use ",
                  hookable_layer_for(m), " (dtensor/nn/layers.h) for sequence-parallel layouts");
  }
}

namespace {

// The global shape of local `x` whose dim `d` is Shard(d) of `global_size` over the mesh (torch.chunk's sizes).
std::vector<int64_t> global_shape(const at::Tensor& x, const DeviceMesh& mesh, int64_t d, int64_t global_size,
                                  const std::string& what) {
  const int64_t local = x.size(d);
  const auto sizes = chunk_sizes(global_size, mesh.size(0));
  const int64_t expected = sizes[mesh.get_local_rank(0)];
  DTENSOR_CHECK(local == expected, "dtensor: ", what, ": the input's dim ", d, " has ", local,
                " local entries, but Shard(", d, ") of ", global_size, " over ", mesh.size(0), " ranks gives rank ",
                mesh.get_local_rank(0), " ", expected);
  std::vector<int64_t> shape = x.sizes().vec();
  shape[d] = global_size;
  return shape;
}

}  // namespace

at::Tensor prepare_input(const at::Tensor& x, const DeviceMesh& mesh, const Placement& layout, const Placement& desired,
                         std::optional<int64_t> sharded_size, const std::string& what) {
  std::optional<std::vector<int64_t>> shape;
  if (!is_dtensor(x) && sharded_size && layout.is_shard() && x.dim() > 0) {
    shape = global_shape(x, mesh, layout.normalized(x.dim()).dim(), *sharded_size, what);
  }
  at::Tensor dt = is_dtensor(x) ? x : DTensor::from_local(x, mesh, {layout}, /*run_check=*/false, shape);
  if (placements(dt)[0] != desired.normalized(dt.dim())) dt = redistribute(dt, mesh, {desired});
  return dt;
}

at::Tensor prepare_output(const at::Tensor& out, const DeviceMesh& mesh, const Placement& desired, bool use_local) {
  at::Tensor dt = out;
  if (is_dtensor(dt) && placements(dt)[0] != desired.normalized(dt.dim())) dt = redistribute(dt, mesh, {desired});
  return use_local && is_dtensor(dt) ? to_local(dt) : dt;
}

c10::IValue prepare_input_value(const c10::IValue& value, const DeviceMesh& mesh, const Placement& layout,
                                const Placement& desired, bool use_local, const std::string& what) {
  if (value.isNone()) return value;
  DTENSOR_CHECK(value.isTensor(), "dtensor: ", what, " has a layout but is a ", value.tagKind(), ", not a tensor");
  const at::Tensor& x = value.toTensor();
  if (!x.defined()) return value;  // None stays None
  at::Tensor prepared = prepare_input(x, mesh, layout, desired);
  return use_local ? to_local(prepared) : prepared;
}

at::Tensor& first_tensor_input(std::vector<c10::IValue>& args, const std::string& style) {
  DTENSOR_CHECK(!args.empty() && args[0].isTensor(), "dtensor: ", style,
                " needs the module's first input to be a tensor");
  return args[0].toTensor();
}

}  // namespace dtensor::detail
