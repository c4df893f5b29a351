// A Llama-3-style decoder (HF's LlamaForCausalLM, torchtitan's models/llama3/model.py): token embedding,
// RMSNorm, rotary embeddings (Llama-3 theta, HF's rotate-half convention), grouped-query attention through
// scaled_dot_product_attention (causal), SwiGLU feed-forward, final norm, output projection, optional tied
// embeddings. Parameter names are HF's (model.layers.0.self_attn.q_proj.weight, ...).
//
// No parallel code: the plans (llama/parallelize.h) hook the layers from outside. The model only follows
// the two rules of dtensor/nn/module_hooks.h: hookable layers (dtensor::nn::Linear, Embedding,
// RMSNorm), and DTENSOR_MODULE for the blocks a plan targets directly (attention and feed-forward).
// Shapes are read from tensors (`view({b, s, -1, head_dim})`, n_rep = q heads / k heads), so the same code
// runs on global-shaped DTensors (torchtitan's plan) and on local shards (HF's plan).
//
// One forward for training, generation and serving: the KV caches and a packed step's metadata come from the
// forward's context (common/forward_context.h, vLLM's ForwardContext), never from the model, which holds no cache.
// With dense caches (inference/kv_cache.h) each forward appends its tokens' keys and values and attends to all
// cached positions; with paged ones and a PagedStep (inference/paged_kv_cache.h) the tokens [1, T] are the step's,
// several sequences packed side by side.
// An attention_mask [b, past + s] (HF's: 1 a token, 0 left padding) gives each sequence its own positions
// (count of tokens before it) and hides its padding. Without cache and mask the forward is the training one
// (causal over s, positions 0..s-1).
//
// The parts a config chooses (config.h; each family's choices are a file in llama/families/): biases on
// q/k/v (and o) and on the MLP, an explicit head_dim, q/k norms (per head: Qwen3, Gemma 3; over all heads:
// OLMo2), a sliding window on some layers (their own additive mask: HF's index-space window,
// kv > q - window), the rotary scaling (rope.h; Gemma 3's own base on sliding layers, Cohere's interleaved
// pairs, Cohere 2's rotary on sliding layers only), the norm kind (norm.h) and where the norms sit (pre-norm,
// Gemma's sandwich, OLMo2's post-norm, Cohere's parallel block), the MLP (gated or plain, its activation),
// the softmax scale and soft-capping, OLMo's q/k/v clipping, and the multipliers on embeddings, residuals and
// logits (Gemma, Granite, Cohere).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/moduledict.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "dtensor/nn/hooked_module.h"
#include "dtensor/nn/layers.h"
#include "llama/config.h"
#include "common/forward_context.h"
#include "llama/moe.h"
#include "llama/norm.h"
#include "llama/rope.h"

namespace llama {

// What the attention layers need for s new tokens after `past` cached ones, from attention_mask
// [b, past + s] (1: a token, 0: padding): cos, sin [b, 1, s, head_dim] at each sequence's own positions
// (HF's position_ids: tokens before it), and an additive mask [b, 1, s, past + s] (0 or -inf): a query sees
// the tokens at or before it, and itself (so a padding row stays finite; it is never read). With a sliding
// window, sliding_mask also hides the keys at or before query index - window.
// local_cos, local_sin: Gemma 3's sliding layers' own rotary tables (config.rotary.local_theta > 0).

struct AttentionInputs {
  at::Tensor cos, sin, mask, sliding_mask, local_cos, local_sin;
  // Computed in fp32, then in the activations' dtype, as transformers (rotary: cos.to(x.dtype), unless
  // `fp32_tables`; masks: the query's dtype, which SDPA requires). A no-op in fp32.
  AttentionInputs to(at::ScalarType dtype, bool fp32_tables = false) const;
};
AttentionInputs attention_inputs(const LlamaConfig& config, const at::Tensor& attention_mask, int64_t past, int64_t s);
// in's cos and sin (and the local rope's) at `positions` (1-D Long), from tables of table_len positions (frequencies of
// freq_len, -1: table_len) on positions' device, viewed as shape + [rotary_dim]: one home for every forward's rotary.
void rotary_at(const LlamaConfig& config, const at::Tensor& positions, int64_t table_len, at::IntArrayRef shape,
               AttentionInputs& in, int64_t freq_len = -1);
// The same for a packed step of continuous batching (common/kv_cache_layer.h): cos, sin [1, 1, T, head_dim] at each
// token's position, and a block-diagonal causal mask [1, 1, T, K]: a query sees the keys of its own sequence at
// or before its position (and, on sliding layers, after position - window). Throws dtensor::Error for a rotary
// kind whose frequencies depend on the sequence's length (dynamic, longrope): sequences of a step differ in it.
AttentionInputs paged_attention_inputs(const LlamaConfig& config, const models::PagedStep& step);

struct AttentionImpl : torch::nn::Module {
  // layer: its index, which names its cache in a forward's context; sliding: the layer attends within
  // config.attention.sliding_window (when its mask does not say it already).
  AttentionImpl(const LlamaConfig& config, int64_t layer = 0, bool sliding = false);
  // x [b, s, hidden]; cos, sin [s, head_dim] or [b, 1, s, head_dim] (undefined: no rotary); mask:
  // undefined (causal over s, within sliding_window) or additive [b, 1, s, past + s] (holding the window). With a
  // cache in the forward's context, k and v are appended to it and the attention reads all of it. Returns [b, s, hidden].
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask);
  int64_t layer;
  int64_t head_dim;
  double scale;         // the softmax scale
  bool explicit_scale;  // the config sets it (else head_dim^-1/2)
  double softcap;       // attention logit soft-capping (0: off)
  int64_t sliding_window;  // 0: the layer does not slide
  double clip_qkv;      // 0: off
  bool interleaved;     // rotary pairs (2i, 2i+1)
  bool rotate_in_fp32;  // Cohere: q, k rotated in fp32
  bool full_width_qk_norm;
  dtensor::nn::Linear q_proj, k_proj, v_proj, o_proj;
  Norm q_norm{nullptr}, k_norm{nullptr};  // config.attention.qk_norm (per head) or qk_norm_full_width (all heads)
};
DTENSOR_MODULE(Attention);

// The norms present depend on config.norm.placement (config.h's LayerKind): input_layernorm (all but post-norm),
// post_attention_layernorm (all but parallel), pre_feedforward_layernorm (sandwich) and
// post_feedforward_layernorm (sandwich, post-norm).
struct DecoderLayerImpl : torch::nn::Module {
  DecoderLayerImpl(const LlamaConfig& config, int64_t layer);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& mask);
  at::Tensor ffn(const at::Tensor& x);  // the layer's MLP, dense or sparse
  LayerKind kind;
  double residual_multiplier;
  Attention self_attn;
  // "mlp": a dense FeedForward, or on a sparse layer (config.layer_is_moe) a SparseMoeBlock.
  FeedForward mlp{nullptr};
  SparseMoeBlock moe{nullptr};
  Norm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  Norm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};
  bool sliding;  // config.layer_slides(layer): LlamaModel gives it the sliding mask
};
TORCH_MODULE(DecoderLayer);

// HF's LlamaModel: embeddings, layers, final norm. tokens [b, s] -> hidden states [b, s, hidden];
// `layers` is keyed by each layer's index in the whole model (torchtitan's ModuleDict), so that a pipeline stage
// (llama/parallelize_pipeline.h) that keeps some layers keeps their names (model.layers.5...). A stage without
// embed_tokens takes hidden states [b, s, hidden] for `tokens`; one without norm returns its last layer's output.
// attention_mask [b, past + s] or undefined (all tokens); position_ids [s] (HF's position_ids, the same for every
// row): the tokens' positions for the rotary embedding, undefined: 0..s-1. Context parallelism gives its shard's
// positions (dtensor/cp/context_parallel.h), which need neither a cache nor a mask.
// The forward's context (common/forward_context.h) holds the caches (one per layer; past = the cached positions) or,
// for continuous batching, the paged caches and the PagedStep whose tokens [T] are `tokens` [1, T] (no
// attention_mask or position_ids: the step has them). Throws dtensor::Error for a context that does not fit.
struct LlamaModelImpl : torch::nn::Module {
  explicit LlamaModelImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& attention_mask = {}, const at::Tensor& position_ids = {});
  LlamaConfig config;
  dtensor::nn::Embedding embed_tokens;  // null on a pipeline stage after the first
  torch::nn::ModuleDict layers;         // "0", "1", ...: the layers this model (or stage) holds, in order
  Norm norm;                            // null on a pipeline stage before the last

 private:
  // Embeddings, the layers (each with its mask and rotary tables from `in`), the final norm. past > 0: dense caches
  // hold `past` positions (a sliding layer's mask narrowed to what its cache keeps).
  at::Tensor run(const at::Tensor& tokens, const AttentionInputs& in, int64_t past);
  // The context's caches checked against the layers (null: no context or no caches).
  const models::ForwardContext* checked_context() const;
};
TORCH_MODULE(LlamaModel);

// tokens [b, s] -> logits [b, s, vocab] (attention_mask as LlamaModel's). A pipeline stage without lm_head returns
// its hidden states.
struct LlamaForCausalLMImpl : torch::nn::Module {
  explicit LlamaForCausalLMImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& attention_mask = {}, const at::Tensor& position_ids = {});
  // The logits of hidden states [b, s, hidden]: lm_head, then the family's scaling and soft-capping.
  at::Tensor logits(const at::Tensor& hidden);
  // Deterministic initialization from `seed` alone (its own generator: ranks that are threads may build
  // models at once): embeddings N(0, 1), projections N(0, 0.02), o_proj/down_proj N(0, 0.02/sqrt(2(l+1)))
  // (torchtitan's depth init; the experts' down_proj too), lm_head N(0, hidden^-1/2), norms 1.
  void init_weights(uint64_t seed);
  // The load-balancing loss (llama/moe.h) of the last forward's router logits over its sparse layers, the real
  // tokens being attention_mask's (undefined: all); 0 for a dense model. The training loss adds
  // config.moe.router_aux_loss_coef times it. sum_over_ranks: pools the statistics over data-parallel ranks.
  at::Tensor aux_loss(const at::Tensor& attention_mask = {}, const SumOverRanks& sum_over_ranks = nullptr);
  LlamaConfig config;
  LlamaModel model;
  dtensor::nn::Linear lm_head;  // null on a pipeline stage before the last
};
TORCH_MODULE(LlamaForCausalLM);

}  // namespace llama
