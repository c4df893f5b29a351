#include "dtensor/tp/local_styles.h"
#include "dtensor/core/error.h"

#include <torch/nn/modules/linear.h>

#include "dtensor/tp/distribute_module.h"
#include "dtensor/api/dtensor_api.h"
#include "tp/distribute_params.h"
#include "tp/style_support.h"

// The local styles' parameters stay plain tensors, so they skip distribute_module's replication of what is
// left plain: each partitions its own parameters and registers its hooks with register_module_io.

namespace dtensor {
namespace {

using namespace detail;

// The parameter `name` (if present) becomes this rank's plain slice of dim `dim`, packed per `parts`. The
// source rank's values are the truth (broadcast first), as for distribute_tensor.
void localize_param(torch::nn::Module& m, const std::string& name, int64_t dim, const std::vector<int64_t>& parts,
                    const DeviceMesh& mesh, std::optional<int> src, const std::string& what) {
  auto params = m.named_parameters(/*recurse=*/false);
  if (!params.contains(name) || !params[name].defined()) return;
  const at::Tensor& old = params[name];
  at::Tensor full = src ? to_local(distribute_tensor(old.detach(), mesh, {Replicate()}, src)) : old.detach();
  at::Tensor local = packed_slice(full, dim, parts, mesh, what + " '" + name + "'").contiguous();
  local.set_requires_grad(old.requires_grad());
  nn::replace_parameter(m, name, local);
}

}  // namespace

void LocalColwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  DTENSOR_CHECK(is_linear(m) || (is_embedding(m) && packed_parts.size() == 1),
                not_applicable(name(), packed_parts.size() == 1 ? "Linear and Embedding" : "Linear", path, m));
  const auto& weight = m.named_parameters(/*recurse=*/false)["weight"];
  packed_indices(weight.size(is_linear(m) ? 0 : 1), packed_parts, 1, 0, name() + " on '" + path + "'");
  require_hookable(m, name(), path);  // after the type check, whose error comes first
}

void LocalColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                 std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  const std::string what = name() + " on '" + path + "'";
  // Linear W [out, in] and b: this rank's (packed) rows; Embedding W [vocab, dim]: its columns.
  if (is_linear(m)) {
    localize_param(m, "weight", 0, packed_parts, mesh, src, what);
    localize_param(m, "bias", 0, packed_parts, mesh, src, what);
  } else {
    localize_param(m, "weight", 1, packed_parts, mesh, src, what);
  }
  // Every rank needs the whole input: a DTensor is made Replicate (an all-gather if sharded) and local; a
  // plain tensor is taken as is. The output is this rank's local columns.
  const std::string style = name();
  register_module_io(m, mesh,
                     [style](torch::nn::Module&, nn::Args args, nn::KwArgs kwargs, const DeviceMesh& mesh) {
                       at::Tensor& x = first_tensor_input(args, style);
                       if (is_dtensor(x)) x = to_local(redistribute(x, mesh, {Replicate()}));
                       return std::make_pair(std::move(args), std::move(kwargs));
                     },
                     nullptr);
}

void LocalRowwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&m);
  DTENSOR_CHECK(linear, not_applicable(name(), "Linear", path, m));
  DTENSOR_CHECK(!linear->bias.defined() || output_layouts, "dtensor: ", name(), " on '", path,
                "': the output is left a partial sum on each rank, so a bias would be added once per "
                "rank; give output_layouts (e.g. Replicate()) or use a Linear without bias");
  packed_indices(linear->weight.size(1), packed_parts, 1, 0, name() + " on '" + path + "'");
  require_hookable(m, name(), path);  // after the type check, whose error comes first
}

void LocalRowwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                 std::optional<int> src) const {
  require_1d(mesh, name());
  validate(m, path);
  auto& linear = dynamic_cast<torch::nn::LinearImpl&>(m);
  const bool has_bias = linear.bias.defined();
  // W [out, in]: this rank's (packed) columns of the input features.
  localize_param(m, "weight", 1, packed_parts, mesh, src, name() + " on '" + path + "'");
  if (has_bias) {
    // The bias stays a registered (replicated, plain) parameter but leaves the Linear's forward: it is
    // added once, after the reduction.
    at::Tensor bias = to_local(distribute_tensor(linear.bias.detach(), mesh, {Replicate()}, src));
    bias.set_requires_grad(linear.bias.requires_grad());
    nn::replace_parameter(m, "bias", bias);
    linear.bias = at::Tensor();
  }
  const std::string style = name();
  const auto parts = packed_parts;
  // A DTensor input is moved to this rank's (packed) columns of the last dim; a plain one is taken as them.
  InputFn input_fn = [style, parts](torch::nn::Module&, nn::Args args, nn::KwArgs kwargs, const DeviceMesh& mesh) {
    at::Tensor& x = first_tensor_input(args, style);
    if (is_dtensor(x)) {
      x = parts.size() == 1 ? to_local(redistribute(x, mesh, {Shard(-1)}))
                            : packed_slice(to_local(redistribute(x, mesh, {Replicate()})), -1, parts, mesh, "input");
    }
    return std::make_pair(std::move(args), std::move(kwargs));
  };
  OutputFn output_fn;
  if (output_layouts) {
    // The output is this rank's partial sum: to Replicate = all-reduce, to Shard(d) = reduce-scatter.
    output_fn = [out = *output_layouts, local = use_local_output, has_bias](torch::nn::Module& module, c10::IValue y,
                                                                            const DeviceMesh& mesh) -> c10::IValue {
      at::Tensor dt = redistribute(DTensor::from_local(y.toTensor(), mesh, {Partial()}), mesh, {out});
      if (has_bias) {
        at::Tensor bias = module.named_parameters(/*recurse=*/false)["bias"];
        dt = dt + DTensor::from_local(bias, mesh, {Replicate()});
      }
      return local ? to_local(dt) : dt;
    };
  }
  register_module_io(m, mesh, std::move(input_fn), std::move(output_fn));
}

}  // namespace dtensor
