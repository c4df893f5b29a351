// Weight-only int8 Linear layers (include/dtensor/quant/int8_weight_only.h): torchao's per-row quantization, the
// matmul on local shards under the TP layouts, and quantize_ over a model.
#include "dtensor/quant/int8_weight_only.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/parameter_replacement.h"
#include "nn/forward_override.h"
#include "quant/converted_linears.h"

namespace dtensor::quant {
namespace {

// The local product on plain tensors: x [..., K], q [N, K], s [N].
at::Tensor local_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& s) {
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = q.size(0);
  if (auto y = int8_weight_linear(x2, q, s)) return y->view(shape);
  // torchao's formula (Int8Tensor's linear, per row): the product rounded to x's dtype, then the scale in it.
  return (at::mm(x2, q.to(x.scalar_type()).t()) * s.to(x.scalar_type())).view(shape);
}

// Whether mesh dim i shards the weight's columns (its k): the dims whose amax must be all-reduced.
bool shards_k(const Placement& p) { return p.is_shard(1) && !p.is_strided_shard(); }

}  // namespace

at::Tensor row_abs_max(const at::Tensor& weight) {
  // choose_qparams_affine, SYMMETRIC: min_val_neg = min(amin, 0), max_val_pos = max(amax, 0), max(-min_val_neg,
  // max_val_pos), in the weight's dtype (exact: a max of its values).
  const auto [lo, hi] = at::aminmax(weight, /*dim=*/1);
  return at::maximum(lo.clamp_max(0).neg(), hi.clamp_min(0));
}

std::pair<at::Tensor, at::Tensor> quantize_per_row(const at::Tensor& weight, const at::Tensor& amax) {
  DTENSOR_CHECK(weight.dim() == 2 && at::isFloatingType(weight.scalar_type()),
                "dtensor: int8 weight-only quantization: a weight must be a 2-D floating tensor (got ", weight.dim(),
                "-D ", weight.scalar_type(), ")");
  const at::Tensor m = amax.defined() ? amax : row_abs_max(weight);
  // scale = max_val_pos / ((127 - (-128)) / 2) in the weight's dtype, clamped to fp32's eps (torchao passes it for
  // every dtype), stored in fp32.
  const at::Tensor scale = m.div(127.5).clamp_min(std::numeric_limits<float>::epsilon()).to(at::kFloat);
  // quantize_affine: round(w * (1 / scale)) + zero_point (0), clamped to [-128, 127], in fp32 (w promoted). In slices
  // of rows: the fp32 temporaries of a whole lm_head (128256 x 2048) were 3 GB at once, more than the model's bf16.
  const at::Tensor inverse = scale.reciprocal().unsqueeze(1);
  at::Tensor q = at::empty(weight.sizes(), weight.options().dtype(at::kChar));
  const int64_t rows = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(1, weight.size(1)));
  for (int64_t r0 = 0; r0 < weight.size(0); r0 += rows) {
    const int64_t r1 = std::min(weight.size(0), r0 + rows);
    q.slice(0, r0, r1).copy_(at::round(weight.slice(0, r0, r1).to(at::kFloat) * inverse.slice(0, r0, r1)).clamp_(-128, 127));
  }
  return {q, scale};
}

at::Tensor int8_weight_only_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale) {
  if (!is_dtensor(x) && !is_dtensor(q)) return local_linear(x, q, scale);
  DTENSOR_CHECK(is_dtensor(x) && is_dtensor(q) && is_dtensor(scale),
                "dtensor: int8 weight-only linear: the input, the int8 weight and its scales must all be DTensors or "
                "all plain tensors");
  const DeviceMesh& mesh = device_mesh(q);
  const Placements py = detail::output_placements(x, q, detail::Scheme::int8_weight_only);
  const at::Tensor y = local_linear(to_local(x), to_local(q), to_local(scale));
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = q.size(0);
  return DTensor::from_local(y, mesh, py, /*run_check=*/false, shape);
}

bool is_int8_weight_only(const torch::nn::Module& module) {
  return detail::is_converted(module, detail::Scheme::int8_weight_only);
}

std::vector<std::string> quantize_(torch::nn::Module& model, const Int8WeightOnlyConfig&, const ModuleFilter& filter) {
  const auto chosen = detail::linears_to_convert(model, detail::Scheme::int8_weight_only, filter);
  std::vector<std::string> names;
  at::NoGradGuard no_grad;
  for (auto& [name, linear] : chosen) {
    const at::Tensor w = linear->weight;
    at::Tensor q, s;
    if (!is_dtensor(w)) {
      std::tie(q, s) = quantize_per_row(w.detach());
    } else {
      const DeviceMesh& mesh = device_mesh(w);
      const Placements& pw = placements(w);
      const at::Tensor local = to_local(w).detach();
      at::Tensor amax = row_abs_max(local);
      Placements ps;
      for (int64_t i = 0; i < mesh.ndim(); ++i) {
        const Placement& p = pw[i];
        DTENSOR_CHECK(p.is_replicate() || (p.is_shard() && !p.is_strided_shard() && (p.dim() == 0 || p.dim() == 1)),
                      "dtensor: quantize_ (int8 weight-only): '", name, "' has its weight laid out ", to_string(pw),
                      ": only Shard(0), Shard(1) and Replicate are supported");
        // A row's maximum is the max of its columns' shards: exact whatever the order.
        if (shards_k(p)) mesh.get_group(i).all_reduce_(amax, ReduceOp::MAX);
        ps.push_back(p.is_shard(0) ? Shard(0) : Replicate());
      }
      auto [ql, sl] = quantize_per_row(local, amax);
      q = DTensor::from_local(ql, mesh, pw, /*run_check=*/false, w.sizes().vec());
      s = DTensor::from_local(sl, mesh, ps, /*run_check=*/false, std::vector<int64_t>{w.size(0)});
    }
    nn::replace_parameter(*linear, "weight", q.requires_grad_(false));
    linear->register_buffer("weight_scale", s);
    nn::detail::register_forward_override(*linear, [](torch::nn::Module& m, const nn::Args& args,
                                                      const nn::KwArgs&) -> std::optional<c10::IValue> {
      auto& l = static_cast<nn::LinearImpl&>(m);
      at::Tensor y = int8_weight_only_linear(args.at(0).toTensor(), l.weight, l.named_buffers(false)["weight_scale"]);
      if (l.bias.defined()) y = y + l.bias;
      return c10::IValue(y);
    });
    detail::mark_converted(*linear, detail::Scheme::int8_weight_only);
    names.push_back(name);
  }
  return names;
}

}  // namespace dtensor::quant
