#include "llama/model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "dtensor/core/error.h"
#include "dtensor/nn/parameter_replacement.h"

namespace llama {
namespace {

dtensor::nn::Linear linear(int64_t in, int64_t out, bool bias = false) {
  return dtensor::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

// [b, kv_heads, s, d] -> [b, kv_heads * n_rep, s, d], each head repeated n_rep times in place.
at::Tensor repeat_kv(const at::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  auto b = x.size(0), kv = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n_rep, s, d}).reshape({b, kv * n_rep, s, d});
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The additive masks [b, 1, s, t] (0 or -inf) over cache indices: `visible` [b, s, t] and, with a sliding
// window, the same with keys at or before query index - window hidden too.
void fill_masks(const LlamaConfig& config, const at::Tensor& visible, const at::Tensor& query_pos,
                const at::Tensor& key_pos, AttentionInputs& in) {
  auto additive = [](const at::Tensor& see) {
    return at::zeros(see.sizes(), see.options().dtype(at::kFloat))
        .masked_fill_(see.logical_not(), -std::numeric_limits<float>::infinity())
        .unsqueeze(1);
  };
  in.mask = additive(visible);
  if (config.sliding_window > 0) in.sliding_mask = additive(visible & (key_pos > query_pos - config.sliding_window).unsqueeze(0));
}

}  // namespace

AttentionInputs attention_inputs(const LlamaConfig& config, const at::Tensor& attention_mask, int64_t past, int64_t s) {
  const int64_t b = attention_mask.size(0), t = past + s;
  DTENSOR_CHECK(attention_mask.dim() == 2 && attention_mask.size(1) == t, "llama: attention_mask must be [batch, ", t,
                "] (cached ", past, " + new ", s, " positions), got ", attention_mask.dim(), "-d with last size ",
                attention_mask.size(-1));
  at::Tensor real = attention_mask.to(at::kBool);                                        // [b, t]
  at::Tensor pos = (real.to(at::kLong).cumsum(1) - 1).clamp_min(0).narrow(1, past, s);  // [b, s]
  // dynamic / longrope: the frequencies of this forward's length, HF's max(position_ids) + 1.
  const int64_t freq_len = rope_depends_on_length(config) ? pos.max().item<int64_t>() + 1 : t;
  auto [cos_table, sin_table] = rotary_tables(config, t, attention_mask.device(), freq_len);  // [t, d]
  const int64_t d = cos_table.size(1);
  AttentionInputs in;
  in.cos = cos_table.index_select(0, pos.reshape({-1})).view({b, 1, s, d});
  in.sin = sin_table.index_select(0, pos.reshape({-1})).view({b, 1, s, d});
  const auto longs = attention_mask.options().dtype(at::kLong);
  at::Tensor query_pos = at::arange(past, t, longs).view({s, 1});
  at::Tensor key_pos = at::arange(t, longs).view({1, t});
  at::Tensor visible = (key_pos <= query_pos).unsqueeze(0) & (real.unsqueeze(1) | (key_pos == query_pos).unsqueeze(0));
  fill_masks(config, visible, query_pos, key_pos, in);
  return in;
}

AttentionImpl::AttentionImpl(const LlamaConfig& c)
    : head_dim(c.head_dim()),
      q_proj(register_module("q_proj", linear(c.hidden_size, c.num_attention_heads * c.head_dim(), c.q_bias()))),
      k_proj(register_module("k_proj", linear(c.hidden_size, c.num_key_value_heads * c.head_dim(), c.q_bias()))),
      v_proj(register_module("v_proj", linear(c.hidden_size, c.num_key_value_heads * c.head_dim(), c.q_bias()))),
      o_proj(register_module("o_proj", linear(c.num_attention_heads * c.head_dim(), c.hidden_size, c.attention_bias))) {
  if (c.qk_norm) {
    q_norm = register_module("q_norm", dtensor::nn::RMSNorm(c.head_dim(), c.rms_norm_eps));
    k_norm = register_module("k_norm", dtensor::nn::RMSNorm(c.head_dim(), c.rms_norm_eps));
  }
}

at::Tensor AttentionImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const at::Tensor& mask) {
  const int64_t b = x.size(0), s = x.size(1);
  at::Tensor q = q_proj(x).view({b, s, -1, head_dim});  // [b, s, heads, head_dim]
  at::Tensor k = k_proj(x).view({b, s, -1, head_dim});  // [b, s, kv_heads, head_dim]
  at::Tensor v = v_proj(x).view({b, s, -1, head_dim}).transpose(1, 2);
  if (q_norm) q = q_norm(q), k = k_norm(k);  // per head, before rotary
  q = apply_rotary(q.transpose(1, 2), cos, sin);  // [b, heads, s, head_dim]
  k = apply_rotary(k.transpose(1, 2), cos, sin);
  if (cache) std::tie(k, v) = cache->update(k, v);  // [b, kv_heads, past + s, head_dim]
  const int64_t n_rep = q.size(1) / k.size(1);  // query heads per key/value head
  const std::optional<at::Tensor> attn_mask = mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt;
  at::Tensor out = at::scaled_dot_product_attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), attn_mask,
                                                    /*dropout_p=*/0.0, /*is_causal=*/!mask.defined());
  return o_proj(out.transpose(1, 2).reshape({b, s, -1}));
}

FeedForwardImpl::FeedForwardImpl(const LlamaConfig& c)
    : gate_proj(register_module("gate_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias))),
      up_proj(register_module("up_proj", linear(c.hidden_size, c.intermediate_size, c.mlp_bias))),
      down_proj(register_module("down_proj", linear(c.intermediate_size, c.hidden_size, c.mlp_bias))) {}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) { return down_proj(at::silu(gate_proj(x)) * up_proj(x)); }

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c, int64_t layer)
    : self_attn(register_module("self_attn", Attention(c))),
      mlp(register_module("mlp", FeedForward(c))),
      input_layernorm(register_module("input_layernorm", dtensor::nn::RMSNorm(c.hidden_size, c.rms_norm_eps))),
      post_attention_layernorm(
          register_module("post_attention_layernorm", dtensor::nn::RMSNorm(c.hidden_size, c.rms_norm_eps))),
      sliding(c.layer_slides(layer)) {}

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& mask) {
  at::Tensor h = x + self_attn(input_layernorm(x), cos, sin, mask);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c)
    : config(c),
      embed_tokens(register_module("embed_tokens", dtensor::nn::Embedding(c.vocab_size, c.hidden_size))),
      layers(register_module("layers", torch::nn::ModuleList())),
      norm(register_module("norm", dtensor::nn::RMSNorm(c.hidden_size, c.rms_norm_eps))) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(DecoderLayer(c, i));
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& tokens, const at::Tensor& attention_mask) {
  const int64_t b = tokens.size(0), s = tokens.size(1), past = cache_length();
  AttentionInputs in;  // mask undefined: causal over s (the training forward)
  if (has_cache() || attention_mask.defined() || config.sliding_window > 0) {
    at::Tensor padding =
        attention_mask.defined() ? attention_mask : at::ones({b, past + s}, tokens.options().dtype(at::kLong));
    in = attention_inputs(config, padding, past, s);
  } else {
    std::tie(in.cos, in.sin) = rotary_tables(config, s, tokens.device());
  }
  at::Tensor h = embed_tokens(tokens);
  // Through the layer's hooks (module_hooks.h rule 2): fully_shard gathers a layer's parameters there.
  for (const auto& layer : *layers) {
    auto& l = *layer->as<DecoderLayerImpl>();
    at::Tensor mask = l.sliding ? in.sliding_mask : in.mask;
    // A sliding layer's cache keeps the last window - 1 positions: its keys are columns [first, past + s).
    const int64_t first = l.sliding && l.self_attn->cache ? std::max<int64_t>(0, past - (config.sliding_window - 1)) : 0;
    if (first > 0) mask = mask.narrow(-1, first, mask.size(-1) - first);
    h = dtensor::nn::forward_with_hooks(l, h, in.cos, in.sin, mask);
  }
  return norm(h);
}

void LlamaModelImpl::setup_cache(int64_t max_len) {
  for (const auto& layer : *layers) {
    auto& l = *layer->as<DecoderLayerImpl>();
    l.self_attn->cache = std::make_shared<KVCache>(max_len, l.sliding ? config.sliding_window : 0);
  }
}

void LlamaModelImpl::clear_cache() {
  for (const auto& layer : *layers) layer->as<DecoderLayerImpl>()->self_attn->cache.reset();
}

bool LlamaModelImpl::has_cache() const {
  return !layers->is_empty() && layers->at<DecoderLayerImpl>(0).self_attn->cache != nullptr;
}

int64_t LlamaModelImpl::cache_length() const {
  return has_cache() ? layers->at<DecoderLayerImpl>(0).self_attn->cache->length() : 0;
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c)
    : config(c),
      model(register_module("model", LlamaModel(c))),
      lm_head(register_module("lm_head", linear(c.hidden_size, c.vocab_size))) {
  c.validate();
  if (c.tie_word_embeddings) dtensor::nn::replace_parameter(*lm_head, "weight", model->embed_tokens->weight);
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& tokens, const at::Tensor& attention_mask) {
  // Through the model's own hooks (module_hooks.h rule 2): fully_shard(model) gathers the root's parameters.
  return dtensor::nn::call_with_hooks(*this, {tokens, attention_mask},
                                      [this](const dtensor::nn::Tensors& in) { return lm_head(model(in[0], in[1])); });
}

void LlamaForCausalLMImpl::init_weights(uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    at::Tensor& p = item.value();
    if (ends_with(name, "norm.weight")) {
      p.fill_(1.0);
      continue;
    }
    double std = 0.02;
    if (name == "model.embed_tokens.weight") {
      std = 1.0;
    } else if (name == "lm_head.weight") {
      if (config.tie_word_embeddings) continue;
      std = 1.0 / std::sqrt(static_cast<double>(config.hidden_size));
    } else if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight")) {
      const int64_t layer = std::stoll(name.substr(std::string("model.layers.").size()));
      std = 0.02 / std::sqrt(2.0 * static_cast<double>(layer + 1));
    }
    p.copy_(at::normal(0.0, std, p.sizes(), gen));
  }
}

}  // namespace llama
