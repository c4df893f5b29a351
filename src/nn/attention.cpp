#include "dtensor/nn/attention.h"

#include <ATen/ATen.h>

namespace dtensor::nn {
namespace {

thread_local AttentionOverride current;

}  // namespace

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, t, d}).reshape({b, kv * n_rep, t, d});
}

at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& mask, bool is_causal, std::optional<double> scale) {
  if (current) return current(q, k, v, mask, is_causal, scale);
  const int64_t n_rep = q.size(1) / k.size(1);
  const std::optional<at::Tensor> attn_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  return at::scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask, /*dropout_p=*/0.0,
                                          is_causal, scale);
}

bool attention_overridden() { return static_cast<bool>(current); }

AttentionOverrideGuard::AttentionOverrideGuard(AttentionOverride f) : previous_(std::move(current)) { current = std::move(f); }

AttentionOverrideGuard::~AttentionOverrideGuard() { current = std::move(previous_); }

}  // namespace dtensor::nn
