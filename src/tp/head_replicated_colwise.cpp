#include "dtensor/tp/head_replicated_colwise.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/nn/module_hooks.h"
#include "dtensor/api/dtensor_api.h"
#include "tp/distribute_params.h"

namespace dtensor {

void HeadReplicatedColwiseParallel::validate_mesh(const std::string& path, const DeviceMesh& mesh) const {
  DTENSOR_CHECK(mesh.ndim() == 1, "dtensor: ", name(), " on '", path, "' needs a 1-D mesh");
  const int64_t tp = mesh.size();
  if (num_heads % tp == 0 || tp % num_heads == 0) return;
  throw DTENSOR_ERROR("dtensor: ", name(), " on '", path, "': ", num_heads, " key/value heads and TP degree ", tp,
                      " divide neither way (need heads % tp == 0, or tp % heads == 0 to replicate each head)");
}

void HeadReplicatedColwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  ColwiseParallel colwise;
  colwise.validate(m, path);
  const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&m);
  DTENSOR_CHECK(linear, "dtensor: ", name(), " applies to Linear, but '", path, "' is a ", m.name());
  DTENSOR_CHECK(linear->options.out_features() == num_heads * head_dim, "dtensor: ", name(), " on '", path,
                "': out_features ", linear->options.out_features(), " != num_heads ", num_heads, " * head_dim ",
                head_dim);
}

void HeadReplicatedColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                          std::optional<int> src) const {
  validate(m, path);
  validate_mesh(path, mesh);
  const int64_t tp = mesh.size();
  if (num_heads % tp == 0) {  // whole heads per rank: plain ColwiseParallel
    ColwiseParallel colwise;
    colwise.use_local_output = use_local_output;
    colwise.apply(m, path, mesh, src);
    return;
  }
  detail::distribute_params(m, mesh, {{"weight", {Replicate()}}, {"bias", {Replicate()}}}, src);
  nn::register_forward_pre_hook(m, [mesh](torch::nn::Module&, nn::Tensors xs) {
    at::Tensor x = is_dtensor(xs[0]) ? xs[0] : DTensor::from_local(xs[0], mesh, {Replicate()});
    if (placements(x)[0] != Replicate()) x = redistribute(x, mesh, {Replicate()});  // Shard -> Replicate: all-gather
    xs[0] = x;
    return xs;
  });
  const int64_t heads = num_heads, d = head_dim, rep = tp / num_heads;
  const bool local_out = use_local_output;
  nn::register_forward_hook(m, [mesh, heads, d, rep, local_out](torch::nn::Module&, const nn::Tensors&, at::Tensor y) {
    // y: Replicate [.., heads * d] -> each head repeated rep times: Replicate [.., tp * d] -> Shard(-1), a local
    // chunk: rank r keeps head r / rep. Backward: Shard(-1) -> Replicate is an all-gather of the head gradients,
    // and the repeat's backward sums the rep copies of each head (the ranks that share it).
    std::vector<int64_t> grouped = y.sizes().vec();
    grouped.back() = heads;
    grouped.push_back(1);
    grouped.push_back(d);
    std::vector<int64_t> repeated = grouped;
    repeated[repeated.size() - 2] = rep;
    std::vector<int64_t> flat = y.sizes().vec();
    flat.back() = heads * rep * d;
    at::Tensor out = y.reshape(grouped).expand(repeated).reshape(flat);
    out = redistribute(out, mesh, {Shard(out.dim() - 1)});
    return local_out ? to_local(out) : out;
  });
}

}  // namespace dtensor
