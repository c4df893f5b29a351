// Weight-only int4 Linear layers (include/dtensor/quant/int4_weight_only.h): torchao's group-wise quantization, the
// packed layout, the matmul on local shards under the TP layouts, and quantize_ over a model.
#include "dtensor/quant/int4_weight_only.h"

#include <ATen/ATen.h>

#include <sstream>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/parameter_replacement.h"
#include "nn/forward_override.h"
#include "quant/converted_linears.h"

namespace dtensor::quant {
namespace {

// The local product on plain tensors: x [..., K], the weight's local parts.
at::Tensor local_linear(const at::Tensor& x, const Int4Weight& w) {
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.q.size(0);
  if (auto y = int4_weight_linear(x2, w.q, w.scale, w.zero, w.group_size)) return y->view(shape);
  return at::mm(x2, dequantize_int4(w, x.scalar_type()).t()).view(shape);
}

Int4Weight local_parts(const Int4Weight& w) {
  return {to_local(w.q), to_local(w.scale), w.zero.defined() ? to_local(w.zero) : at::Tensor(), w.group_size};
}

bool shards_k(const Placement& p) { return p.is_shard(1) && !p.is_strided_shard(); }

// The TP degrees (up to 64) that keep whole groups of a k of `groups` groups: its divisors.
std::string whole_group_degrees(int64_t groups) {
  std::ostringstream s;
  const char* sep = "";
  for (int64_t d = 1; d <= std::min<int64_t>(groups, 64); ++d) {
    if (groups % d == 0) s << sep << d, sep = ", ";
  }
  return s.str();
}

void check_group_size(int64_t group) {
  DTENSOR_CHECK(group == 32 || group == 64 || group == 128 || group == 256,
                "dtensor: int4 weight-only: group_size ", group, " is not supported (32, 64, 128 or 256, torchao's)");
}

}  // namespace

at::Tensor pack_int4(const at::Tensor& values) {
  DTENSOR_CHECK(values.dim() == 2 && values.size(1) % 32 == 0, "dtensor: pack_int4: values [N, K] with K a multiple of 32");
  const int64_t N = values.size(0), K = values.size(1);
  const at::Tensor v = values.to(at::kByte).reshape({N, K / 32, 2, 16});
  return v.select(2, 0).bitwise_or(v.select(2, 1).bitwise_left_shift(4)).reshape({N, K / 2}).contiguous();
}

at::Tensor unpack_int4(const at::Tensor& q) {
  const int64_t N = q.size(0), K = q.size(1) * 2;
  const at::Tensor b = q.reshape({N, K / 32, 16});
  return at::stack({b.bitwise_and(15), b.bitwise_right_shift(4)}, 2).reshape({N, K});
}

Int4Weight quantize_groupwise(const at::Tensor& weight, int64_t group) {
  check_group_size(group);
  DTENSOR_CHECK(weight.dim() == 2 && at::isFloatingType(weight.scalar_type()),
                "dtensor: int4 weight-only quantization: a weight must be a 2-D floating tensor (got ", weight.dim(),
                "-D ", weight.scalar_type(), ")");
  const int64_t N = weight.size(0), K = weight.size(1);
  DTENSOR_CHECK(K % group == 0, "dtensor: int4 weight-only quantization: in_features ", K, " is not a multiple of ",
                "group_size ", group);
  // Each step in the weight's dtype, as torchao's ops on it (python floats keep the tensor's dtype).
  const at::Tensor w = weight.reshape({N, K / group, group});
  const at::Tensor lo = at::amin(w, -1), hi = at::amax(w, -1);
  const at::Tensor scale = (hi - lo).div(15.0).clamp_min(1e-6);
  const at::Tensor zero = lo + scale * 8.0;
  const at::Tensor min_val = (zero - scale * 8.0).unsqueeze(-1);
  const at::Tensor v = at::round((w - min_val) / scale.unsqueeze(-1)).clamp_(0, 15).reshape({N, K});
  return {pack_int4(v), scale.contiguous(), zero.contiguous(), group};
}

at::Tensor dequantize_int4(const Int4Weight& w, at::ScalarType dtype) {
  const int64_t N = w.q.size(0), K = w.q.size(1) * 2, g = w.group_size;
  const at::Tensor v = unpack_int4(w.q).to(at::kFloat).sub_(8).reshape({N, K / g, g});
  at::Tensor out = v * w.scale.to(at::kFloat).unsqueeze(-1);
  if (w.zero.defined()) out = out + w.zero.to(at::kFloat).unsqueeze(-1);
  return out.reshape({N, K}).to(dtype);
}

at::Tensor int4_weight_only_linear(const at::Tensor& x, const Int4Weight& w) {
  if (!is_dtensor(x) && !is_dtensor(w.q)) return local_linear(x, w);
  DTENSOR_CHECK(is_dtensor(x) && is_dtensor(w.q) && is_dtensor(w.scale) && (!w.zero.defined() || is_dtensor(w.zero)),
                "dtensor: int4 weight-only linear: the input, the int4 weight, its scales and zeros must all be "
                "DTensors or all plain tensors");
  const DeviceMesh& mesh = device_mesh(w.q);
  const Placements py = detail::output_placements(x, w.q, detail::Scheme::int4_weight_only);
  const at::Tensor y = local_linear(to_local(x), local_parts(w));
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = w.q.size(0);
  return DTensor::from_local(y, mesh, py, /*run_check=*/false, shape);
}

bool int4_kernels_available() { return int4_weight_linear_available(); }

bool is_int4_weight_only(const torch::nn::Module& module) {
  return detail::is_converted(module, detail::Scheme::int4_weight_only);
}

void set_int4_weight(torch::nn::Module& module, const std::string& fqn, const Int4Weight& weight) {
  auto* linear = dynamic_cast<nn::LinearImpl*>(&module);
  DTENSOR_CHECK(linear != nullptr, "dtensor: set_int4_weight: '", fqn, "' is not a dtensor::nn::Linear");
  check_group_size(weight.group_size);
  detail::check_convertible(fqn, *linear, detail::Scheme::int4_weight_only);
  const int64_t K = linear->weight.size(1);
  DTENSOR_CHECK(weight.q.size(0) == linear->weight.size(0) && weight.q.size(1) * 2 == K &&
                    weight.scale.dim() == 2 && weight.scale.size(1) * weight.group_size == K,
                "dtensor: set_int4_weight: '", fqn, "': the parts do not match its weight ", linear->weight.sizes());
  nn::replace_parameter(*linear, "weight", weight.q.detach().requires_grad_(false));
  linear->register_buffer("weight_scale", weight.scale);
  if (weight.zero.defined()) linear->register_buffer("weight_zero", weight.zero);
  const int64_t group = weight.group_size;
  nn::detail::register_forward_override(*linear, [group](torch::nn::Module& m, const nn::Args& args,
                                                         const nn::KwArgs&) -> std::optional<c10::IValue> {
    auto& l = static_cast<nn::LinearImpl&>(m);
    auto buffers = l.named_buffers(false);
    const at::Tensor* zero = buffers.find("weight_zero");
    at::Tensor y = int4_weight_only_linear(
        args.at(0).toTensor(), {l.weight, buffers["weight_scale"], zero ? *zero : at::Tensor(), group});
    if (l.bias.defined()) y = y + l.bias;
    return c10::IValue(y);
  });
  detail::mark_converted(*linear, detail::Scheme::int4_weight_only);
}

std::vector<std::string> quantize_(torch::nn::Module& model, const Int4WeightOnlyConfig& config,
                                   const ModuleFilter& filter) {
  const int64_t g = config.group_size;
  check_group_size(g);
  const auto chosen = detail::linears_to_convert(model, detail::Scheme::int4_weight_only, filter);
  // Every layer checked before any converts: a refusal leaves the model as it was.
  for (auto& [name, linear] : chosen) {
    const at::Tensor& w = linear->weight;
    const int64_t K = w.size(1);
    DTENSOR_CHECK(K % g == 0, "dtensor: quantize_ (int4 weight-only): '", name, "' has in_features ", K,
                  ", not a multiple of group_size ", g, " (group sizes that divide it: ",
                  K % 32 == 0 ? (K % 64 == 0 ? (K % 128 == 0 ? "32, 64, 128" : "32, 64") : "32") : "none", ")");
    if (!is_dtensor(w)) continue;
    const DeviceMesh& mesh = device_mesh(w);
    const Placements& pw = placements(w);
    int64_t k_shards = 1;
    for (int64_t i = 0; i < mesh.ndim(); ++i) {
      const Placement& p = pw[i];
      DTENSOR_CHECK(p.is_replicate() || (p.is_shard() && !p.is_strided_shard() && (p.dim() == 0 || p.dim() == 1)),
                    "dtensor: quantize_ (int4 weight-only): '", name, "' has its weight laid out ", to_string(pw),
                    ": only Shard(0), Shard(1) and Replicate are supported");
      if (shards_k(p)) k_shards *= mesh.size(i);
    }
    DTENSOR_CHECK(K % (k_shards * g) == 0, "dtensor: quantize_ (int4 weight-only): '", name, "' (in_features ", K,
                  ", ", K / g, " groups of ", g, ") is split over k by a degree of ", k_shards,
                  ", which cuts a group between ranks; degrees that keep whole groups: ", whole_group_degrees(K / g));
  }
  std::vector<std::string> names;
  at::NoGradGuard no_grad;
  for (auto& [name, linear] : chosen) {
    const at::Tensor w = linear->weight;
    Int4Weight q;
    if (!is_dtensor(w)) {
      q = quantize_groupwise(w.detach(), g);
    } else {
      // A row's groups lie along k inside one rank's shard (checked above): each rank quantizes its own.
      const DeviceMesh& mesh = device_mesh(w);
      const Placements& pw = placements(w);
      const Int4Weight l = quantize_groupwise(to_local(w).detach(), g);
      const std::vector<int64_t> qs{w.size(0), w.size(1) / 2}, ss{w.size(0), w.size(1) / g};
      q = {DTensor::from_local(l.q, mesh, pw, false, qs), DTensor::from_local(l.scale, mesh, pw, false, ss),
           DTensor::from_local(l.zero, mesh, pw, false, ss), g};
    }
    set_int4_weight(*linear, name, q);
    names.push_back(name);
  }
  return names;
}

}  // namespace dtensor::quant
