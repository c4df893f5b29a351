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
#include "dtensor/nn/attention.h"
#include "dtensor/nn/default_device.h"
#include "dtensor/nn/materialize.h"
#include "dtensor/nn/parameter_replacement.h"

namespace llama {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Norm norm_of(const LlamaConfig& c, int64_t dim) { return Norm(c.norm.kind, dim, c.norm.rms_norm_eps, c.norm.bias); }

}  // namespace

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& c, int64_t layer)
    : kind(c.norm.placement),
      residual_multiplier(c.scaling.residual_multiplier),
      self_attn(register_module("self_attn", Attention(c, layer, c.layer_slides(layer)))),
      sliding(c.layer_slides(layer)) {
  if (c.layer_is_moe(layer)) {
    moe = register_module("mlp", SparseMoeBlock(c));
  } else {
    mlp = register_module("mlp", FeedForward(c));
  }
  if (kind != LayerKind::post_norm) input_layernorm = register_module("input_layernorm", norm_of(c, c.hidden_size));
  if (kind != LayerKind::parallel) {
    post_attention_layernorm = register_module("post_attention_layernorm", norm_of(c, c.hidden_size));
  }
  if (kind == LayerKind::sandwich) {
    pre_feedforward_layernorm = register_module("pre_feedforward_layernorm", norm_of(c, c.hidden_size));
  }
  if (kind == LayerKind::sandwich || kind == LayerKind::post_norm) {
    post_feedforward_layernorm = register_module("post_feedforward_layernorm", norm_of(c, c.hidden_size));
  }
}

at::Tensor DecoderLayerImpl::ffn(const at::Tensor& x) { return moe ? moe(x) : mlp(x); }

at::Tensor DecoderLayerImpl::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                     const at::Tensor& mask) {
  switch (kind) {
    case LayerKind::pre_norm: {
      if (residual_multiplier != 1.0) {  // Granite
        at::Tensor h = x + self_attn(input_layernorm(x), cos, sin, mask) * residual_multiplier;
        return h + ffn(post_attention_layernorm(h)) * residual_multiplier;
      }
      at::Tensor h = x + self_attn(input_layernorm(x), cos, sin, mask);
      return h + ffn(post_attention_layernorm(h));
    }
    case LayerKind::sandwich: {
      at::Tensor h = x + post_attention_layernorm(self_attn(input_layernorm(x), cos, sin, mask));
      return h + post_feedforward_layernorm(ffn(pre_feedforward_layernorm(h)));
    }
    case LayerKind::post_norm: {
      at::Tensor h = x + post_attention_layernorm(self_attn(x, cos, sin, mask));
      return h + post_feedforward_layernorm(ffn(h));
    }
    case LayerKind::parallel: {
      const at::Tensor n = input_layernorm(x);
      return x + self_attn(n, cos, sin, mask) + ffn(n);
    }
  }
  return x;
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& c)
    : config(c),
      embed_tokens(register_module("embed_tokens", dtensor::nn::Embedding(c.vocab_size, c.hidden_size))),
      layers(register_module("layers", torch::nn::ModuleDict())),
      norm(register_module("norm", norm_of(c, c.hidden_size))) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->update({{std::to_string(i), DecoderLayer(c, i).ptr()}});
}

const models::ForwardContext* LlamaModelImpl::checked_context() const {
  const models::ForwardContext* ctx = models::forward_context();
  if (!ctx || ctx->kv_caches.empty()) {
    DTENSOR_CHECK(!ctx || !ctx->paged_step, "llama: the forward's context has a PagedStep but no paged KV caches");
    return nullptr;
  }
  DTENSOR_CHECK(static_cast<int64_t>(ctx->kv_caches.size()) == config.num_hidden_layers, "llama: the forward's context has ",
                ctx->kv_caches.size(), " KV caches for ", config.num_hidden_layers, " layers");
  for (const auto& cache : ctx->kv_caches) {
    DTENSOR_CHECK(cache && cache->paged() == (ctx->paged_step != nullptr), "llama: the forward's context ",
                  ctx->paged_step ? "has a PagedStep beside dense (or missing) KV caches"
                                  : "has paged (or missing) KV caches without a PagedStep");
  }
  return ctx;
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& tokens, const at::Tensor& attention_mask, const at::Tensor& position_ids) {
  const models::ForwardContext* ctx = checked_context();
  if (ctx && ctx->paged_step) {  // continuous batching: the step holds the positions and the mask
    const models::PagedStep& step = *ctx->paged_step;
    DTENSOR_CHECK(!attention_mask.defined() && !position_ids.defined(), "llama: a paged step has its own positions and "
                  "mask: no attention_mask or position_ids");
    DTENSOR_CHECK(tokens.dim() == 2 && tokens.size(0) == 1 && tokens.size(1) == step.tokens.numel(), "llama: a paged "
                  "step of ", step.tokens.numel(), " tokens takes them as [1, ", step.tokens.numel(), "], got ", tokens.sizes());
    return run(tokens, paged_attention_inputs(config, step), /*past=*/0);
  }
  const int64_t b = tokens.size(0), s = tokens.size(1), past = ctx ? ctx->past() : 0;
  AttentionInputs in;  // mask undefined: causal over s (the training forward)
  if (position_ids.defined()) {
    DTENSOR_CHECK(!ctx && !attention_mask.defined(), "llama: position_ids are taken without a cache or an "
                  "attention mask");
    // A later pipeline stage under sequence parallel is given its rows of the hidden states: the positions are the
    // whole sequence's, which its attention gathers.
    DTENSOR_CHECK(position_ids.dim() == 1 && (position_ids.size(0) == s || (!embed_tokens && position_ids.size(0) % s == 0)),
                  "llama: position_ids must be [", s, "], got ", position_ids.sizes());
    DTENSOR_CHECK(!rope_depends_on_length(config), "llama: rope_type '", config.rotary.rope_scaling.rope_type,
                  "' follows the sequence's length: position_ids do not say it");
    // The table up to the largest position (a dry run's meta positions have no values: the model's whole range).
    const int64_t len = position_ids.is_meta() ? config.max_position_embeddings : position_ids.max().item<int64_t>() + 1;
    rotary_at(config, position_ids.to(tokens.device()), len, {position_ids.size(0)}, in);
    return run(tokens, in, past);
  }
  // Without a cache or padding no mask is built: attention is causal, a sliding layer's within its window.
  if (ctx || attention_mask.defined()) {
    at::Tensor padding =
        attention_mask.defined() ? attention_mask : at::ones({b, past + s}, tokens.options().dtype(at::kLong));
    in = attention_inputs(config, padding, past, s);
  } else {
    std::tie(in.cos, in.sin) = rotary_tables(config, s, tokens.device());
    if (config.rotary.local_theta > 0) std::tie(in.local_cos, in.local_sin) = rotary_tables(local_rope_config(config), s, tokens.device());
  }
  return run(tokens, in, past);
}

at::Tensor LlamaModelImpl::run(const at::Tensor& tokens, const AttentionInputs& inputs, int64_t past) {
  // The parameters' dtype: what every activation is in. A later pipeline stage is given hidden states.
  at::Tensor h = embed_tokens ? embed_tokens(tokens) : tokens;
  const AttentionInputs in = inputs.to(h.scalar_type(), config.rotary.fp32_tables);
  if (embed_tokens && config.scaling.embedding_scale_sqrt_hidden) {
    // Gemma: times sqrt(hidden) as a tensor of the activations' dtype (so rounded to it first).
    h = h * at::scalar_tensor(std::sqrt(static_cast<double>(config.hidden_size)), h.options().device(at::kCPU)).item<double>();
  }
  if (embed_tokens && config.scaling.embedding_multiplier != 1.0) h = h * config.scaling.embedding_multiplier;  // Granite
  // Through the layer's hooks (module_hooks.h rule 2): fully_shard gathers a layer's parameters there.
  for (const auto& layer : layers->values()) {
    auto& l = *layer->as<DecoderLayerImpl>();
    at::Tensor mask = l.sliding ? in.sliding_mask : in.mask;
    // A sliding layer's cache keeps the last window - 1 positions: its keys are columns [first, past + s).
    const int64_t first = l.sliding ? models::sliding_first_kept(past, config.attention.sliding_window) : 0;
    if (first > 0) mask = mask.narrow(-1, first, mask.size(-1) - first);
    // Rotary: Gemma 3's sliding layers take their own tables; Cohere 2's full layers none.
    const bool local = l.sliding && config.rotary.local_theta > 0;
    const bool rotary = !config.rotary.on_sliding_only || l.sliding;
    const at::Tensor cos = !rotary ? at::Tensor() : local ? in.local_cos : in.cos;
    const at::Tensor sin = !rotary ? at::Tensor() : local ? in.local_sin : in.sin;
    h = dtensor::nn::forward_with_hooks(l, h, cos, sin, mask);
  }
  return norm ? norm(h) : h;
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& c)
    : config(c),
      model(register_module("model", LlamaModel(c))),
      lm_head(register_module("lm_head", linear(c.hidden_size, c.vocab_size))) {
  c.validate();
  if (c.tie_word_embeddings) dtensor::nn::replace_parameter(*lm_head, "weight", model->embed_tokens->weight);
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& tokens, const at::Tensor& attention_mask,
                                         const at::Tensor& position_ids) {
  // Through the model's own hooks (module_hooks.h rule 2): fully_shard(model) gathers the root's parameters.
  return dtensor::nn::call_with_hooks(*this, {tokens, attention_mask, position_ids},
                                      [this](const dtensor::nn::Tensors& in) {
    at::Tensor h = model(in[0], in[1], in[2]);
    return lm_head ? logits(h) : h;
  });
}

at::Tensor LlamaForCausalLMImpl::logits(const at::Tensor& hidden) {
  at::Tensor out = lm_head(hidden);
  if (config.scaling.logits_scaling != 1.0) out = out / config.scaling.logits_scaling;  // Granite
  if (config.scaling.logit_scale != 1.0) out = out * config.scaling.logit_scale;        // Cohere
  const double cap = config.scaling.final_logit_softcapping;                  // Gemma 2 / 3
  if (cap > 0) out = dtensor::nn::soft_cap(out, cap);
  return out;
}

at::Tensor LlamaForCausalLMImpl::aux_loss(const at::Tensor& attention_mask, const SumOverRanks& sum_over_ranks) {
  std::vector<at::Tensor> logits;
  for (const auto& layer : model->layers->values()) {
    const auto& moe = layer->as<DecoderLayerImpl>()->moe;
    if (moe) logits.push_back(moe->router_logits);
  }
  if (logits.empty()) return at::zeros({});
  return load_balancing_loss(logits, config.moe.num_experts, config.moe.top_k, attention_mask, sum_over_ranks);
}

void LlamaForCausalLMImpl::init_weights(uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::NoGradGuard no_grad;
  // The draws follow the whole model's parameters in order, whatever this model holds: a pipeline stage (which keeps
  // some layers) draws the others' values too and drops them, so every stage takes the whole model's values.
  std::vector<std::pair<std::string, std::vector<int64_t>>> whole;
  {
    dtensor::nn::DefaultDeviceGuard meta(at::kMeta);
    LlamaForCausalLMImpl all(config);
    for (const auto& item : all.named_parameters()) whole.emplace_back(item.key(), item.value().sizes().vec());
  }
  auto mine = named_parameters();
  for (const auto& [name, shape] : whole) {
    at::Tensor* p = mine.find(name);
    if (ends_with(name, "norm.weight") || ends_with(name, "norm.bias")) {
      if (p) p->fill_(ends_with(name, "weight") && config.norm.kind != NormKind::rms_one_plus ? 1.0 : 0.0);  // the identity
      continue;
    }
    double std = 0.02;
    if (name == "model.embed_tokens.weight") {
      std = 1.0;
    } else if (name == "lm_head.weight") {
      if (config.tie_word_embeddings) continue;
      std = 1.0 / std::sqrt(static_cast<double>(config.hidden_size));
    } else if (ends_with(name, "o_proj.weight") || ends_with(name, "down_proj.weight") ||
               ends_with(name, "experts.down_proj")) {
      const int64_t layer = std::stoll(name.substr(std::string("model.layers.").size()));
      std = 0.02 / std::sqrt(2.0 * static_cast<double>(layer + 1));
    }
    // The whole tensor's values from the one generator, then this rank's part of them (a DTensor's shard): the same
    // weights at every TP degree, and on a model parallelized before its parameters were filled (materialize.h).
    const at::Tensor values = at::normal(0.0, std, shape, gen);
    if (p) dtensor::nn::copy_from_full_(*p, values);
  }
}

}  // namespace llama
