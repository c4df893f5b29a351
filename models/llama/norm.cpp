#include "llama/norm.h"

#include <ATen/ATen.h>

#include "dtensor/core/error.h"
#include "dtensor/nn/default_device.h"

namespace llama {

NormImpl::NormImpl(NormKind kind_, int64_t dim_, double eps_, bool bias_, bool written_out_, int64_t rows_)
    : kind(kind_), dim(dim_), rows(rows_), eps(eps_), written_out(written_out_) {
  DTENSOR_CHECK(rows == 0 || kind == NormKind::layer_norm_weight_only, "llama: a norm with a weight per row is a "
                "weight-only LayerNorm (Cohere's q/k norms)");
  // On the device a DefaultDeviceGuard names (meta for the dry run), as the layers of dtensor/nn do.
  auto options = at::TensorOptions().dtype(at::kFloat);
  if (const auto device = dtensor::nn::DefaultDeviceGuard::current()) options = options.device(*device);
  if (kind != NormKind::layer_norm_no_affine) {
    weight = register_parameter("weight", rows > 0 ? at::ones({rows, dim}, options) : at::ones({dim}, options));
  }
  if (kind == NormKind::layer_norm && bias_) bias = register_parameter("bias", at::zeros({dim}, options));
}

at::Tensor* NormImpl::parameter_member(const std::string& name) {
  if (name == "weight") return &weight;
  if (name == "bias") return &bias;
  return nullptr;
}

at::Tensor NormImpl::forward(const at::Tensor& x) {
  switch (kind) {
    case NormKind::rms: {
      // HF's LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) in fp32, back to x's dtype, times w. Fused where it
      // can be; written out where the normalized dim may be sharded (a DTensor reduction, see norm.h).
      if (x.scalar_type() == at::kFloat && !written_out) return at::rms_norm(x, {dim}, weight, eps);
      const at::Tensor x32 = x.to(at::kFloat);
      return weight * (x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
    }
    case NormKind::rms_weight_fp32: {  // OLMo 2: (w * x / rms(x)) in fp32, then x's dtype
      const at::Tensor x32 = x.to(at::kFloat);
      return (weight * (x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps))).to(x.scalar_type());
    }
    case NormKind::rms_one_plus: {  // Gemma: (1 + w) and the product in fp32, then x's dtype
      const at::Tensor x32 = x.to(at::kFloat);
      const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
      return (normed * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
    }
    case NormKind::layer_norm: return at::layer_norm(x, {dim}, weight, bias, eps);
    case NormKind::layer_norm_weight_only: {  // Cohere: in fp32, times w in fp32
      if (rows == 0) return at::layer_norm(x.to(at::kFloat), {dim}, weight.to(at::kFloat), {}, eps).to(x.scalar_type());
      // x [.., n * rows, dim]: the weight's rows each repeated n times ([rows, dim] -> [rows * n, dim]).
      at::Tensor w = weight.to(at::kFloat);
      const int64_t n = x.size(-2) / rows;
      if (n != 1) w = w.unsqueeze(1).expand({rows, n, dim}).reshape({rows * n, dim});
      return (at::layer_norm(x.to(at::kFloat), {dim}, {}, {}, eps) * w).to(x.scalar_type());
    }
    case NormKind::layer_norm_no_affine:  // OLMo: F.layer_norm(x.float(), ...) without parameters
      return at::layer_norm(x.to(at::kFloat), {dim}, {}, {}, eps).to(x.scalar_type());
  }
  return x;
}

}  // namespace llama
