#include "dtensor/nn/attention.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"

namespace dtensor::nn {
namespace {

thread_local AttentionOverride current;

void check_kwargs(const at::Tensor& mask, bool is_causal, const AttentionKwargs& kwargs) {
  DTENSOR_CHECK(kwargs.sliding_window >= 0 && kwargs.softcap >= 0, "dtensor: attention: sliding_window and softcap must "
                "not be negative, got ", kwargs.sliding_window, " and ", kwargs.softcap);
  DTENSOR_CHECK(kwargs.sliding_window == 0 || (is_causal && !mask.defined()), "dtensor: attention: a sliding window is "
                "taken with is_causal and no mask (a mask holds its own window)");
}

// The window's mask for q's scores: a plain tensor, replicated on q's mesh when q is a DTensor (under TP the heads
// are sharded; every rank's heads take the same mask).
at::Tensor window_mask(const at::Tensor& q, int64_t t, int64_t sliding_window) {
  const at::Tensor mask = causal_mask(q.size(2), t, sliding_window, q.options().device(q.device()));
  if (!is_dtensor(q)) return mask;
  return DTensor::from_local(mask, device_mesh(q), replicate_all(device_mesh(q).ndim()));
}

}  // namespace

at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t b = x.size(0), kv = x.size(1), t = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, t, d}).reshape({b, kv * n_rep, t, d});
}

at::Tensor causal_visible(const at::Tensor& query_pos, const at::Tensor& key_pos, int64_t sliding_window) {
  const at::Tensor distance = query_pos - key_pos;
  at::Tensor visible = distance >= 0;
  if (sliding_window > 0) visible = visible & (distance < sliding_window);
  return visible;
}

at::Tensor additive_mask(const at::Tensor& visible, const at::TensorOptions& options) {
  return at::zeros(visible.sizes(), options).masked_fill_(visible.logical_not(), -std::numeric_limits<double>::infinity());
}

at::Tensor causal_mask(int64_t s, int64_t t, int64_t sliding_window, const at::TensorOptions& options) {
  const auto longs = options.dtype(at::kLong);
  // The s queries sit at key indices t - s .. t - 1.
  return additive_mask(causal_visible(at::arange(t - s, t, longs).view({s, 1}), at::arange(t, longs).view({1, t}),
                                      sliding_window), options);
}

at::Tensor soft_cap(const at::Tensor& x, double cap) { return at::tanh(x / cap) * cap; }

at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& mask, bool is_causal, std::optional<double> scale,
                                        const AttentionKwargs& kwargs) {
  check_kwargs(mask, is_causal, kwargs);
  if (current) return current(q, k, v, mask, is_causal, scale, kwargs);
  if (kwargs.softcap > 0) return eager_attention(q, k, v, mask, is_causal, scale, kwargs);
  const int64_t n_rep = q.size(1) / k.size(1);
  std::optional<at::Tensor> attn_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  if (kwargs.sliding_window > 0) {
    attn_mask = window_mask(q, k.size(2), kwargs.sliding_window);
    is_causal = false;
  }
  return at::scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask, /*dropout_p=*/0.0,
                                          is_causal, scale);
}

at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool is_causal, std::optional<double> scale, const AttentionKwargs& kwargs) {
  check_kwargs(mask, is_causal, kwargs);
  const int64_t n_rep = q.size(1) / k.size(1);
  const double sc = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor scores = at::matmul(q, repeat_kv(k, n_rep).transpose(2, 3)) * sc;
  if (kwargs.softcap > 0) scores = soft_cap(scores, kwargs.softcap);
  at::Tensor add = mask;
  if (!add.defined() && (is_causal || kwargs.sliding_window > 0)) {
    add = window_mask(q, k.size(2), kwargs.sliding_window);
  }
  if (add.defined()) scores = scores + add;
  const at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
  return at::matmul(probs, repeat_kv(v, n_rep));
}

bool attention_overridden() { return static_cast<bool>(current); }

AttentionOverrideGuard::AttentionOverrideGuard(AttentionOverride f) : previous_(std::move(current)) { current = std::move(f); }

AttentionOverrideGuard::~AttentionOverrideGuard() { current = std::move(previous_); }

}  // namespace dtensor::nn
