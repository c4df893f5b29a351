// Attention: the masks and rotary tables of a forward (attention_inputs), and the attention layer with the
// parts a config chooses (model.h).
#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>

#include "dtensor/core/error.h"
#include "dtensor/nn/attention.h"
#include "llama/model.h"

namespace llama {
namespace {

// The additive masks [b, 1, s, t] (0 or -inf) over cache indices: `visible` [b, s, t] (the causal rule and the
// padding, or the sequences of a paged step) and, with a sliding window, the same within the window: both by
// dtensor::nn's one visibility rule (dtensor/nn/attention.h).
void fill_masks(const LlamaConfig& config, const at::Tensor& visible, const at::Tensor& query_pos,
                const at::Tensor& key_pos, AttentionInputs& in) {
  auto additive = [](const at::Tensor& see) {
    return dtensor::nn::additive_mask(see, see.options().dtype(at::kFloat)).unsqueeze(1);
  };
  in.mask = additive(visible);
  const int64_t w = config.attention.sliding_window;
  if (w > 0) in.sliding_mask = additive(visible & dtensor::nn::causal_visible(query_pos, key_pos, w).unsqueeze(0));
}

}  // namespace

AttentionInputs AttentionInputs::to(at::ScalarType dtype, bool fp32_tables) const {
  auto cast = [dtype](const at::Tensor& t) { return t.defined() ? t.to(dtype) : t; };
  if (fp32_tables) return {cos, sin, cast(mask), cast(sliding_mask), local_cos, local_sin};
  return {cast(cos), cast(sin), cast(mask), cast(sliding_mask), cast(local_cos), cast(local_sin)};
}

void rotary_at(const LlamaConfig& config, const at::Tensor& positions, int64_t table_len, at::IntArrayRef shape,
               AttentionInputs& in, int64_t freq_len) {
  std::vector<int64_t> view(shape.begin(), shape.end());
  view.push_back(-1);
  auto gather = [&](const LlamaConfig& c, at::Tensor& cos, at::Tensor& sin) {
    auto [cos_table, sin_table] = rotary_tables(c, table_len, positions.device(), freq_len);  // [table_len, d]
    cos = cos_table.index_select(0, positions).view(view);
    sin = sin_table.index_select(0, positions).view(view);
  };
  gather(config, in.cos, in.sin);
  if (config.rotary.local_theta > 0) gather(local_rope_config(config), in.local_cos, in.local_sin);
}

AttentionInputs attention_inputs(const LlamaConfig& config, const at::Tensor& attention_mask, int64_t past, int64_t s) {
  const int64_t b = attention_mask.size(0), t = past + s;
  DTENSOR_CHECK(attention_mask.dim() == 2 && attention_mask.size(1) == t, "llama: attention_mask must be [batch, ", t,
                "] (cached ", past, " + new ", s, " positions), got ", attention_mask.dim(), "-d with last size ",
                attention_mask.size(-1));
  at::Tensor real = attention_mask.to(at::kBool);                                        // [b, t]
  at::Tensor pos = (real.to(at::kLong).cumsum(1) - 1).clamp_min(0).narrow(1, past, s);  // [b, s]
  // dynamic / longrope: the frequencies of this forward's length, HF's max(position_ids) + 1.
  const int64_t freq_len = rope_depends_on_length(config) ? pos.max().item<int64_t>() + 1 : t;
  AttentionInputs in;
  rotary_at(config, pos.reshape({-1}), t, {b, 1, s}, in, freq_len);
  const auto longs = attention_mask.options().dtype(at::kLong);
  at::Tensor query_pos = at::arange(past, t, longs).view({s, 1});
  at::Tensor key_pos = at::arange(t, longs).view({1, t});
  // Causal, and a padding query sees itself (its row stays finite; it is never read).
  at::Tensor visible = dtensor::nn::causal_visible(query_pos, key_pos, 0).unsqueeze(0) &
                       (real.unsqueeze(1) | (key_pos == query_pos).unsqueeze(0));
  fill_masks(config, visible, query_pos, key_pos, in);
  return in;
}

AttentionInputs paged_attention_inputs(const LlamaConfig& config, const models::PagedStep& step) {
  DTENSOR_CHECK(!rope_depends_on_length(config), "llama: rope_type '", config.rotary.rope_scaling.rope_type,
                "' is not supported with continuous batching (its frequencies follow each sequence's length)");
  const int64_t t = step.tokens.numel();
  const int64_t table_len = step.positions.numel() ? step.positions.max().item<int64_t>() + 1 : 1;
  AttentionInputs in;
  rotary_at(config, step.positions, table_len, {1, 1, t}, in);
  if (step.attention_from_pool) return in;  // the caches attend over each sequence's own keys: no mask
  at::Tensor query_pos = step.positions.view({t, 1}), key_pos = step.key_pos.view({1, -1});
  at::Tensor visible =
      ((step.key_seq.view({1, -1}) == step.query_seq.view({t, 1})) & dtensor::nn::causal_visible(query_pos, key_pos, 0)).unsqueeze(0);
  fill_masks(config, visible, query_pos, key_pos, in);
  return in;
}

AttentionImpl::AttentionImpl(const LlamaConfig& c, int64_t layer_index, bool sliding)
    : layer(layer_index),
      head_dim(c.head_dim()),
      scale(c.attention.scale > 0 ? c.attention.scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim()))),
      explicit_scale(c.attention.scale > 0),
      softcap(c.attention.attn_logit_softcapping),
      sliding_window(sliding ? c.attention.sliding_window : 0),
      clip_qkv(c.attention.clip_qkv),
      interleaved(c.rotary.interleaved),
      rotate_in_fp32(c.rotary.rotate_in_fp32),
      full_width_qk_norm(c.attention.qk_norm_full_width),
      q_proj(register_module("q_proj", linear(c.hidden_size, c.num_attention_heads * c.head_dim(), c.q_bias()))),
      k_proj(register_module("k_proj", linear(c.hidden_size, c.num_key_value_heads * c.head_dim(), c.q_bias()))),
      v_proj(register_module("v_proj", linear(c.hidden_size, c.num_key_value_heads * c.head_dim(), c.q_bias()))),
      o_proj(register_module("o_proj", linear(c.num_attention_heads * c.head_dim(), c.hidden_size, c.attention.attention_bias))) {
  if (c.attention.qk_norm) {  // over head_dim; Cohere's weight a row per head
    const bool rows = c.attention.qk_norm_per_head_weight;
    q_norm = register_module("q_norm", Norm(c.norm.kind, c.head_dim(), c.norm.rms_norm_eps, false, false, rows ? c.num_attention_heads : 0));
    k_norm = register_module("k_norm", Norm(c.norm.kind, c.head_dim(), c.norm.rms_norm_eps, false, false, rows ? c.num_key_value_heads : 0));
  } else if (c.attention.qk_norm_full_width) {  // over the heads' whole width, which TP shards: written out (norm.h)
    q_norm = register_module("q_norm", Norm(c.norm.kind, c.num_attention_heads * c.head_dim(), c.norm.rms_norm_eps, false, true));
    k_norm = register_module("k_norm", Norm(c.norm.kind, c.num_key_value_heads * c.head_dim(), c.norm.rms_norm_eps, false, true));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const at::Tensor& mask) {
  const int64_t b = x.size(0), s = x.size(1);
  at::Tensor q = q_proj(x), k = k_proj(x), v = v_proj(x);  // [b, s, heads * head_dim]
  if (clip_qkv > 0) q = q.clamp(-clip_qkv, clip_qkv), k = k.clamp(-clip_qkv, clip_qkv), v = v.clamp(-clip_qkv, clip_qkv);
  if (full_width_qk_norm) q = q_norm(q), k = k_norm(k);
  q = q.view({b, s, -1, head_dim});  // [b, s, heads, head_dim]
  k = k.view({b, s, -1, head_dim});
  v = v.view({b, s, -1, head_dim}).transpose(1, 2);
  if (q_norm && !full_width_qk_norm) q = q_norm(q), k = k_norm(k);  // per head, before rotary
  q = q.transpose(1, 2), k = k.transpose(1, 2);  // [b, heads, s, head_dim]
  if (cos.defined()) {
    q = apply_rotary(q, cos, sin, interleaved, rotate_in_fp32);
    k = apply_rotary(k, cos, sin, interleaved, rotate_in_fp32);
  }
  // The default scale is left to the kernel (head_dim^-1/2); a config's own is passed.
  const std::optional<double> sdpa_scale = explicit_scale ? std::optional<double>(scale) : std::nullopt;
  // With the forward context's cache of this layer: a paged one attends itself, each sequence over its own blocks
  // (no mask was built); otherwise it gives back the keys to attend to, dense [b, kv_heads, past + s, head_dim] or
  // paged [1, kv_heads, K, head_dim] (the reference, under the step's block-diagonal mask).
  if (const models::ForwardContext* ctx = models::forward_context()) {
    if (models::KVCacheLayer* cache = ctx->cache(layer)) {
      const at::Tensor out = cache->attend(q, k, v, sdpa_scale, {sliding_window, softcap});
      if (out.defined()) return o_proj(out.transpose(1, 2).reshape({b, s, -1}));
      std::tie(k, v) = cache->update(k, v);
    }
  }
  // Through dtensor::nn's kernel: under context parallelism it is ring attention over the sequence's shards. Without a
  // mask the attention is causal, within the layer's window (a mask holds its own).
  const dtensor::nn::AttentionKwargs kwargs{mask.defined() ? 0 : sliding_window, softcap};
  const at::Tensor out = dtensor::nn::scaled_dot_product_attention(q, k, v, mask, /*is_causal=*/!mask.defined(), sdpa_scale, kwargs);
  return o_proj(out.transpose(1, 2).reshape({b, s, -1}));
}

}  // namespace llama
