// The attention kernel of model code: at::scaled_dot_product_attention, unless an override is installed on this
// thread. Context parallelism installs ring attention (dtensor/cp/context_parallel.h), as PyTorch's
// context_parallel patches F.scaled_dot_product_attention: the model's code stays the same.
//
//   at::Tensor out = dtensor::nn::scaled_dot_product_attention(q, k, v, mask, is_causal, scale);
//
// q [b, heads, s, d]; k, v [b, kv_heads, t, d] with kv_heads dividing heads (grouped-query attention: each key/value
// head serves heads / kv_heads query heads); mask undefined or additive [b, 1, s, t]; scale nullopt: d^-1/2.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>

namespace dtensor::nn {

using AttentionOverride = std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                   const at::Tensor& mask, bool is_causal, std::optional<double> scale)>;

// [b, kv_heads, t, d] -> [b, kv_heads * n_rep, t, d], each key/value head repeated n_rep times in place (HF's repeat_kv).
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& mask, bool is_causal, std::optional<double> scale);

// True while an override is installed on this thread (a kernel the override cannot replace, such as soft-capped
// attention, must refuse then rather than compute over this rank's keys alone).
bool attention_overridden();

// Installs `f` for this thread while alive; the previous one (if any) comes back after.
class AttentionOverrideGuard {
 public:
  explicit AttentionOverrideGuard(AttentionOverride f);
  ~AttentionOverrideGuard();
  AttentionOverrideGuard(const AttentionOverrideGuard&) = delete;
  AttentionOverrideGuard& operator=(const AttentionOverrideGuard&) = delete;

 private:
  AttentionOverride previous_;
};

}  // namespace dtensor::nn
