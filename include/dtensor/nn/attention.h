// The attention kernel of model code: at::scaled_dot_product_attention, unless an override is installed on this
// thread. Context parallelism installs ring attention (dtensor/cp/context_parallel.h), as PyTorch's
// context_parallel patches F.scaled_dot_product_attention: the model's code stays the same.
//
//   at::Tensor out = dtensor::nn::scaled_dot_product_attention(q, k, v, mask, is_causal, scale, {.sliding_window = 4096});
//
// q [b, heads, s, d]; k, v [b, kv_heads, t, d] with kv_heads dividing heads (grouped-query attention: each key/value
// head serves heads / kv_heads query heads); mask undefined or additive [b, 1, s, t]; scale nullopt: d^-1/2.
// AttentionKwargs are transformers' attention-interface keywords beyond SDPA's: a sliding window (Mistral, Gemma 2/3,
// Qwen 2, Cohere 2) and logit soft-capping (Gemma 2). Their naive kernel (eager_attention) is beside SDPA's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>

namespace dtensor::nn {

struct AttentionKwargs {
  // > 0, with is_causal and no mask: query i (of s, the last s of t keys) sees keys j with 0 <= (t - s + i) - j <
  // sliding_window, itself included (HF's index-space window, kv > q - window). A mask given already holds its window.
  int64_t sliding_window = 0;
  double softcap = 0.0;  // > 0: scores = softcap * tanh(scores / softcap), before the mask (Gemma 2)
};

using AttentionOverride =
    std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                             bool is_causal, std::optional<double> scale, const AttentionKwargs& kwargs)>;

// [b, kv_heads, t, d] -> [b, kv_heads * n_rep, t, d], each key/value head repeated n_rep times in place (HF's repeat_kv).
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep);

// The one visibility rule of every attention mask of the project (this file's, context parallelism's blocks, the
// decoder's padded, cached and paged masks): a query at position q sees a key at position k when 0 <= q - k and,
// with a sliding window w > 0, q - k < w (HF's index-space window, kv > q - window). Positions broadcast
// (query_pos [s, 1] against key_pos [1, t]); the result is bool.
at::Tensor causal_visible(const at::Tensor& query_pos, const at::Tensor& key_pos, int64_t sliding_window);

// The additive form of a visibility mask, as SDPA takes it: 0 where visible, -inf elsewhere, in `options`' dtype.
at::Tensor additive_mask(const at::Tensor& visible, const at::TensorOptions& options);

// The additive causal mask [s, t] (0 or -inf, in `options`' dtype) of s queries that are the last s of t keys,
// within a sliding window when sliding_window > 0.
at::Tensor causal_mask(int64_t s, int64_t t, int64_t sliding_window, const at::TensorOptions& options);

// Logit soft-capping (Gemma 2's attention scores and final logits): cap * tanh(x / cap).
at::Tensor soft_cap(const at::Tensor& x, double cap);

at::Tensor scaled_dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& mask, bool is_causal, std::optional<double> scale,
                                        const AttentionKwargs& kwargs = {});

// The naive attention (HF's eager_attention_forward): softmax(softcap(q k^T * scale) + mask) v, the softmax in fp32,
// the rest in q's dtype. For soft-capping, which SDPA cannot do; the reference of the fast kernels.
at::Tensor eager_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           bool is_causal, std::optional<double> scale, const AttentionKwargs& kwargs = {});

// True while an override is installed on this thread.
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
