// src/quant/converted_linears.h: the checks and the record the weight-only passes share.
#include "quant/converted_linears.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "nn/forward_override.h"

namespace dtensor::quant::detail {
namespace {

std::mutex registry_mu;
std::vector<std::pair<std::weak_ptr<torch::nn::Module>, Scheme>> converted;

}  // namespace

const char* scheme_name(Scheme scheme) {
  switch (scheme) {
    case Scheme::int8_weight_only: return "int8 weight-only";
    case Scheme::int4_weight_only: return "int4 weight-only";
    case Scheme::bf16_prepacked: return "prepacked bf16";
  }
  return "?";
}

std::string other_parameter(nn::LinearImpl& linear) {
  for (const auto& p : linear.named_parameters(/*recurse=*/true)) {
    if (p.key() != "weight" && p.key() != "bias") return p.key();
  }
  return "";
}

void check_convertible(const std::string& fqn, nn::LinearImpl& linear, Scheme scheme) {
  DTENSOR_CHECK(!nn::detail::has_forward_override(linear), "dtensor: quantize_ (", scheme_name(scheme), "): '", fqn,
                "' already computes through another override (float8, async TP's fused matmuls): they do not compose");
  const std::string other = other_parameter(linear);
  DTENSOR_CHECK(other.empty(), "dtensor: quantize_ (", scheme_name(scheme), "): '", fqn, "' carries '", other,
                "' (an adapter?): quantizing a layer with adapters is not supported");
  DTENSOR_CHECK(at::isFloatingType(linear.weight.scalar_type()), "dtensor: quantize_ (", scheme_name(scheme), "): '",
                fqn, "' has a ", linear.weight.scalar_type(), " weight, not a floating one");
}

Placements output_placements(const at::Tensor& x, const at::Tensor& w, Scheme scheme) {
  const DeviceMesh& mesh = device_mesh(w);
  const Placements px = placements(x), pw = placements(w);
  const int64_t last = x.dim() - 1;
  Placements py;
  for (int64_t i = 0; i < mesh.ndim(); ++i) {
    const Placement a = px[i].normalized(x.dim()), &b = pw[i];
    if (a.is_replicate() && b.is_shard(0) && !b.is_strided_shard()) {
      py.push_back(Shard(last));
    } else if (a.is_shard(last) && b.is_shard(1) && !b.is_strided_shard()) {
      py.push_back(Partial());
    } else if (b.is_replicate() && (a.is_replicate() || (a.is_shard() && a.dim() < last))) {
      py.push_back(a);
    } else {
      throw DTENSOR_ERROR("dtensor: ", scheme_name(scheme), " linear: input ", to_string(px), " with weight ",
                          to_string(pw), " is not a layout it supports (ColwiseParallel's, RowwiseParallel's, or "
                          "replicated weights)");
    }
  }
  return py;
}

bool is_converted(const torch::nn::Module& module, Scheme scheme) {
  std::lock_guard<std::mutex> lock(registry_mu);
  return std::any_of(converted.begin(), converted.end(),
                     [&](const auto& e) { return e.second == scheme && e.first.lock().get() == &module; });
}

bool is_converted(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lock(registry_mu);
  return std::any_of(converted.begin(), converted.end(), [&](const auto& e) { return e.first.lock().get() == &module; });
}

void mark_converted(torch::nn::Module& module, Scheme scheme) {
  std::lock_guard<std::mutex> lock(registry_mu);
  std::erase_if(converted, [](const auto& e) { return e.first.expired(); });
  converted.emplace_back(module.shared_from_this(), scheme);
}

}  // namespace dtensor::quant::detail
