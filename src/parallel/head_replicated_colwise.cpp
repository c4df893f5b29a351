#include "dtensor/parallel/head_replicated_colwise.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "dtensor/error.h"
#include "dtensor/parallel/module_hooks.h"
#include "dtensor/tensor/dtensor.h"
#include "parallel/distribute_params.h"

namespace dtensor {

void HeadReplicatedColwiseParallel::check_degree(const std::string& path, int64_t tp) const {
  if (num_heads % tp == 0 || tp % num_heads == 0) return;
  throw dtensor::Error("dtensor: " + name() + " on '" + path + "': " + std::to_string(num_heads) +
                       " key/value heads and TP degree " + std::to_string(tp) +
                       " divide neither way (need heads % tp == 0, or tp % heads == 0 to replicate each head)");
}

void HeadReplicatedColwiseParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  ColwiseParallel colwise;
  colwise.validate(m, path);
  const auto* linear = dynamic_cast<const torch::nn::LinearImpl*>(&m);
  if (!linear) throw dtensor::Error("dtensor: " + name() + " applies to Linear, but '" + path + "' is a " + m.name());
  if (linear->options.out_features() != num_heads * head_dim) {
    throw dtensor::Error("dtensor: " + name() + " on '" + path + "': out_features " +
                         std::to_string(linear->options.out_features()) + " != num_heads " + std::to_string(num_heads) +
                         " * head_dim " + std::to_string(head_dim));
  }
  if (tp_degree > 0) check_degree(path, tp_degree);
}

void HeadReplicatedColwiseParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                                          std::optional<int> src) const {
  validate(m, path);
  if (mesh.ndim() != 1) throw dtensor::Error("dtensor: " + name() + " needs a 1-D mesh");
  const int64_t tp = mesh.size();
  check_degree(path, tp);
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
  const int64_t head = mesh.get_local_rank(0) / (tp / num_heads);
  const int64_t d = head_dim;
  const bool local_out = use_local_output;
  nn::register_forward_hook(m, [mesh, head, d, local_out](torch::nn::Module&, const nn::Tensors&, at::Tensor y) {
    // y: Replicate [.., heads * d]. Each rank's use of y is a term of the true gradient: Partial(sum).
    at::Tensor mine = to_local(y, Placements{Partial()}).narrow(-1, head * d, d).contiguous();
    if (local_out) return mine;
    return DTensor::from_local(mine, mesh, {Shard(mine.dim() - 1)});  // [.., tp * d], Shard(-1)
  });
}

}  // namespace dtensor
