// Linear weights packed at load for the batched GEMM (include/dtensor/quant/weight_prepack.h): which layers can run
// packed, the packing of each rank's shard, and the forward on local shards.
#include "dtensor/quant/weight_prepack.h"

#include <ATen/ATen.h>

#include <set>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/packed_linear.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/parameter_replacement.h"
#include "nn/forward_override.h"
#include "quant/converted_linears.h"

namespace dtensor::quant {
namespace {

at::Tensor local_of(const at::Tensor& t) { return is_dtensor(t) ? to_local(t) : t; }

// The storages that more than one parameter of `model` holds (a tied lm_head and its embedding).
std::set<const void*> shared_storages(torch::nn::Module& model) {
  std::set<const void*> seen, shared;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    const void* storage = local_of(p.value()).storage().data();
    if (!seen.insert(storage).second) shared.insert(storage);
  }
  return shared;
}

// A layer another pass computes (int8 / int4, float8, async TP: each registered a forward override) or with an
// adapter stays as it is, as does a weight that is not bf16, not laid out as a style lays it, or tied.
bool can_pack(nn::LinearImpl& linear, const std::set<const void*>& tied) {
  if (nn::detail::has_forward_override(linear) || !detail::other_parameter(linear).empty()) return false;
  const at::Tensor& w = linear.weight;
  if (!w.defined() || w.scalar_type() != at::kBFloat16 || w.dim() != 2) return false;
  if (is_dtensor(w)) {
    for (const Placement& p : placements(w)) {
      if (!(p.is_replicate() || (p.is_shard() && !p.is_strided_shard() && (p.dim() == 0 || p.dim() == 1)))) return false;
    }
  }
  const at::Tensor local = local_of(w);
  return local.device().is_cpu() && bf16_packable(local.size(0), local.size(1)) &&
         tied.count(local.storage().data()) == 0;
}

// y = x . W^T on the local shards, the output's placements from x's and W's (converted_linears.h).
at::Tensor packed_forward(const at::Tensor& x, const at::Tensor& w) {
  if (!is_dtensor(x) && !is_dtensor(w)) return bf16_packed_linear(x, w);
  DTENSOR_CHECK(is_dtensor(x) && is_dtensor(w), "dtensor: prepacked linear: the input and the packed weight must "
                "both be DTensors or both plain tensors");
  const Placements py = detail::output_placements(x, w, detail::Scheme::bf16_prepacked);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.size(0);
  return DTensor::from_local(bf16_packed_linear(to_local(x), to_local(w)), device_mesh(w), py, /*run_check=*/false,
                             shape);
}

}  // namespace

bool is_prepacked(const torch::nn::Module& module) { return detail::is_converted(module, detail::Scheme::bf16_prepacked); }

std::vector<std::string> prepack_linear_weights_(torch::nn::Module& model, const ModuleFilter& filter) {
  std::vector<std::string> names;
  if (!bf16_packed_linear_available()) return names;
  at::NoGradGuard no_grad;
  const std::set<const void*> tied = shared_storages(model);
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    auto* linear = dynamic_cast<nn::LinearImpl*>(item.value().get());
    if (linear == nullptr || (filter && !filter(item.key(), *linear)) || !can_pack(*linear, tied)) continue;
    const at::Tensor w = linear->weight;
    const at::Tensor packed = bf16_pack_weight(local_of(w).detach());
    const at::Tensor weight = is_dtensor(w) ? DTensor::from_local(packed, device_mesh(w), placements(w),
                                                                  /*run_check=*/false, w.sizes().vec())
                                            : packed;
    nn::replace_parameter(*linear, "weight", weight.requires_grad_(false));
    nn::detail::register_forward_override(*linear, [](torch::nn::Module& m, const nn::Args& args,
                                                      const nn::KwArgs&) -> std::optional<c10::IValue> {
      auto& l = static_cast<nn::LinearImpl&>(m);
      at::Tensor y = packed_forward(args.at(0).toTensor(), l.weight);
      if (l.bias.defined()) y = y + l.bias;
      return c10::IValue(y);
    });
    detail::mark_converted(*linear, detail::Scheme::bf16_prepacked);
    names.push_back(item.key());
  }
  return names;
}

}  // namespace dtensor::quant
