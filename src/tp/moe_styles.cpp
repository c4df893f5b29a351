#include "dtensor/tp/moe_styles.h"
#include "dtensor/core/error.h"

#include "dtensor/api/dtensor_api.h"
#include "dtensor/mesh/autograd_collectives.h"
#include "dtensor/nn/parameter_members.h"
#include "dtensor/nn/parameter_replacement.h"
#include "dtensor/tp/distribute_module.h"
#include "tp/distribute_params.h"
#include "tp/style_support.h"

namespace dtensor {
namespace {

// Megatron's f: the same tensor forward; in backward each rank's partial gradient is all-reduced. A Replicate
// DTensor made local with a Partial gradient placement: its backward reduces Partial -> Replicate.
at::Tensor identity_forward_all_reduce_backward(const at::Tensor& x, const DeviceMesh& mesh) {
  if (!x.defined() || !x.is_floating_point()) return x;
  return to_local(DTensor::from_local(x, mesh, {Replicate()}), Placements{Partial()});
}

}  // namespace

void MoeTensorParallel::validate(const torch::nn::Module& m, const std::string& path) const {
  const auto params = m.named_parameters(/*recurse=*/false);
  DTENSOR_CHECK(params.contains("gate_up_proj") && params.contains("down_proj") &&
                    params["gate_up_proj"].dim() == 3 && params["down_proj"].dim() == 3,
                detail::not_applicable(name(), "a mixture of experts' module with 3-D gate_up_proj and down_proj", path, m));
  DTENSOR_CHECK(dynamic_cast<const nn::ParameterMembers*>(&m) != nullptr, "dtensor: ", name(), " on '", path, "': ",
                m.name(), " does not name its parameter members (dtensor::nn::ParameterMembers), so its forward "
                "could not read the local shards");
}

void MoeTensorParallel::apply(torch::nn::Module& m, const std::string& path, const DeviceMesh& mesh,
                              std::optional<int> src) const {
  detail::require_1d(mesh, name());
  validate(m, path);
  detail::distribute_params(m, mesh, {{"gate_up_proj", {_StridedShard(1, 2)}}, {"down_proj", {Shard(2)}}}, src);
  auto* group = &mesh.get_group(0);
  register_module_io(
      m, mesh,
      [](torch::nn::Module& module, nn::Args args, nn::KwArgs kwargs, const DeviceMesh& mesh) {
        // The forward reads the local shards (to_local: their gradients come back with the DTensors' placements).
        for (const char* p : {"gate_up_proj", "down_proj"}) {
          nn::set_forward_parameter(module, p, to_local(module.named_parameters(false)[p]));
        }
        if (!args.empty() && args[0].isTensor()) args[0] = identity_forward_all_reduce_backward(args[0].toTensor(), mesh);
        if (args.size() > 2 && args[2].isTensor()) args[2] = identity_forward_all_reduce_backward(args[2].toTensor(), mesh);
        return std::make_pair(std::move(args), std::move(kwargs));
      },
      [group](torch::nn::Module& module, c10::IValue out, const DeviceMesh&) -> c10::IValue {
        for (const char* p : {"gate_up_proj", "down_proj"}) {
          nn::set_forward_parameter(module, p, module.named_parameters(false)[p]);  // the DTensors again
        }
        return all_reduce_autograd(out.toTensor(), ReduceOp::SUM, *group);  // the partial sums over features
      });
}

}  // namespace dtensor
