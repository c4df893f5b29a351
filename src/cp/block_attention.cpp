// Ring attention's blocks (block_attention.h): visibility, window masks, and the kernels.
#include "cp/block_attention.h"

#include <ATen/ATen.h>

#include <limits>

#include "dtensor/nn/attention.h"

namespace dtensor::cp::internal {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool use_flash(const at::Tensor& q, const BlockSpec& spec) { return q.device().is_cpu() && spec.softcap == 0; }

std::optional<at::Tensor> mask_arg(const BlockMask& mask) {
  return mask.additive.defined() ? std::optional<at::Tensor>(mask.additive) : std::nullopt;
}

// The block's scores in fp32, soft-capped and masked; `capped` gets tanh(scores / softcap) when soft-capping.
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const BlockMask& mask, const BlockSpec& spec, at::Tensor* capped) {
  at::Tensor s = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-1, -2)) * spec.scale;
  if (spec.softcap > 0) {  // dtensor::nn::soft_cap, its tanh kept for the backward
    *capped = at::tanh(s / spec.softcap);
    s = *capped * spec.softcap;
  }
  if (mask.causal) {
    const at::Tensor above = at::ones({s.size(-2), s.size(-1)}, s.options().dtype(at::kBool)).triu(1);
    s = s.masked_fill(above, -kInf);
  }
  if (mask.additive.defined()) s = s + mask.additive.to(at::kFloat);
  return s;
}

}  // namespace

std::optional<BlockMask> block_mask(int64_t i, int64_t j, int64_t m, const BlockSpec& spec, const at::Tensor& like) {
  if (!spec.causal) return BlockMask{};
  if (j > i) return std::nullopt;
  const int64_t w = spec.sliding_window;
  const int64_t nearest = (i - j) * m - (m - 1), farthest = (i - j) * m + (m - 1);
  if (w > 0 && nearest >= w) return std::nullopt;
  if (w == 0 || farthest < w) return BlockMask{i == j, {}, {}};
  const auto longs = like.options().dtype(at::kLong);
  // Block i's queries sit at positions i*m .., block j's keys at j*m ..: the one rule (dtensor/nn/attention.h).
  const at::Tensor visible = dtensor::nn::causal_visible(i * m + at::arange(m, longs).view({m, 1}),
                                                         j * m + at::arange(m, longs).view({1, m}), w);
  BlockMask out;
  out.additive = dtensor::nn::additive_mask(visible, like.options());
  if (j < i) out.dead = visible.logical_not().all(-1);  // the diagonal's rows see themselves
  return out;
}

std::pair<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const BlockMask& mask, const BlockSpec& spec) {
  at::Tensor out, lse;
  if (use_flash(q, spec)) {
    std::tie(out, lse) = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, mask.causal, mask_arg(mask), spec.scale);
  } else {
    at::Tensor capped;
    const at::Tensor s = scores(q, k, mask, spec, &capped);
    lse = s.logsumexp(-1);
    const at::Tensor finite = lse.masked_fill(lse.isinf(), 0);  // a dead row: exp(-inf - 0) = 0
    out = at::matmul(at::exp(s - finite.unsqueeze(-1)), v.to(at::kFloat)).to(q.scalar_type());
  }
  // The flash kernel gives a row that sees nothing out 0 and lse 0; as a block it has no weight: lse -inf.
  if (mask.dead.defined()) lse = lse.masked_fill(mask.dead, -kInf);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                              const BlockMask& mask, const BlockSpec& spec) {
  if (use_flash(q, spec)) {
    return at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, mask.causal, mask_arg(mask),
                                                                    spec.scale);
  }
  const at::Tensor qf = q.to(at::kFloat), kf = k.to(at::kFloat), vf = v.to(at::kFloat), dof = dout.to(at::kFloat);
  at::Tensor capped;
  const at::Tensor p = at::exp(scores(q, k, mask, spec, &capped) - lse.unsqueeze(-1));  // the merged lse: finite
  const at::Tensor dv = at::matmul(p.transpose(-1, -2), dof);
  const at::Tensor dp = at::matmul(dof, vf.transpose(-1, -2));
  at::Tensor ds = p * (dp - (dof * out.to(at::kFloat)).sum(-1, true));
  if (spec.softcap > 0) ds = ds * (1 - capped * capped);  // d(c tanh(x / c)) / dx = 1 - tanh^2
  return {(at::matmul(ds, kf) * spec.scale).to(q.scalar_type()),
          (at::matmul(ds.transpose(-1, -2), qf) * spec.scale).to(k.scalar_type()), dv.to(v.scalar_type())};
}

}  // namespace dtensor::cp::internal
