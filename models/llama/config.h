// The decoder's configuration: HF's LlamaConfig fields, plus the parts other families choose, grouped by where they
// act (attention, norm, MLP, rotary, scaling, experts). Each family's differences are a short file in
// llama/families/ (HF config.json in and out: llama/hf_config.h); how a family's checkpoint names its weights is the
// family's, not the model's (llama/hf_config.h's Family::weights).
// torchtitan's names in comments.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace llama {

// HF's rope_parameters (rope_scaling before transformers 5) beyond rope_theta: how the rotary frequencies
// are scaled (llama/rope.h computes them as transformers' modeling_rope_utils does).
struct RopeScaling {
  std::string rope_type = "default";     // default, linear, dynamic, yarn, longrope, llama3
  std::optional<double> factor;          // linear, dynamic, llama3: required; yarn, longrope: derived when absent
  double low_freq_factor = 1.0;          // llama3
  double high_freq_factor = 4.0;         // llama3
  int64_t original_max_position_embeddings = 0;  // llama3, yarn, longrope
  std::optional<double> attention_factor;        // yarn, longrope: cos/sin scale (derived from factor when absent)
  double beta_fast = 32.0, beta_slow = 1.0;      // yarn
  std::optional<double> mscale, mscale_all_dim;  // yarn
  bool truncate = true;                          // yarn
  std::vector<double> short_factor, long_factor; // longrope: head_dim / 2 each
  // llama.cpp's rope_freqs (a GGUF's Llama 3 scaling, which it stores as factors, not as config fields): the
  // default inverse frequencies divided by these, rotary dims / 2 of them. No config.json field writes it.
  std::vector<double> freq_factors;
  // The kinds scaled against original_max_position_embeddings (max_position_embeddings when absent).
  bool has_original_max() const { return rope_type == "llama3" || rope_type == "yarn" || rope_type == "longrope"; }
  bool operator==(const RopeScaling&) const = default;
};

// The norm every norm of the decoder takes (llama/norm.h).
enum class NormKind {
  rms,             // x / rms(x) * w (Llama)
  rms_one_plus,    // x / rms(x) * (1 + w), in fp32 (Gemma)
  rms_weight_fp32, // x / rms(x) * w, the product in fp32 (OLMo 2; Llama casts before the weight)
  layer_norm,      // LayerNorm with weight and bias (StarCoder2)
  layer_norm_weight_only,  // LayerNorm, weight only, in fp32 (Cohere)
  layer_norm_no_affine,    // LayerNorm without parameters, in fp32 (OLMo)
};
// Where a decoder layer's norms sit around attention and the MLP (h: the residual stream).
enum class LayerKind {
  pre_norm,  // h += attn(norm1(h)); h += mlp(norm2(h))                              (Llama)
  sandwich,  // h += post_attn(attn(norm1(h))); h += post_ff(mlp(pre_ff(h)))          (Gemma 2 / 3)
  post_norm, // h += norm1(attn(h)); h += norm2(mlp(h))                              (OLMo2)
  parallel,  // h += attn(norm1(h)) + mlp(norm1(h))                                  (Cohere)
};
enum class MlpKind {
  gated,  // down(act(gate(x)) * up(x)) (SwiGLU, GeGLU)
  plain,  // c_proj(act(c_fc(x))) (StarCoder2)
};

// Mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE; llama/moe.h): a sparse layer's MLP is a router over
// num_experts gated experts, each token using its top_k, plus (Qwen2-MoE) a shared expert behind a sigmoid gate.
struct MoeConfig {
  int64_t num_experts = 0;         // 0: every layer dense
  int64_t top_k = 2;               // num_experts_per_tok
  int64_t intermediate_size = 0;   // each expert's (Mixtral: intermediate_size; Qwen: moe_intermediate_size)
  bool norm_topk_prob = true;      // the top-k weights renormalised to sum 1 (Mixtral: always)
  bool router_weights_fp32 = false;  // Mixtral keeps the routing weights in fp32; Qwen casts them to the model's
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's shared expert (0: none)
  int64_t decoder_sparse_step = 1;       // Qwen: layer l is sparse when (l + 1) % step == 0 ...
  std::vector<int64_t> mlp_only_layers;  // ... and l is not listed here (dense layers use intermediate_size)
  double router_aux_loss_coef = 0.001;   // the load-balancing loss's weight in the training loss
  bool operator==(const MoeConfig&) const = default;
};

// The parts a family chooses, grouped by where they act (all off: Llama 3.0). Each family's file sets them
// (llama/families/); transformers' names where the field is a config.json key.
struct AttentionConfig {
  int64_t head_dim = 0;              // HF's head_dim when config.json gives one (0: hidden / heads)
  bool attention_bias = false;       // q/k/v/o biases (Llama's attention_bias, Qwen3's)
  bool qkv_bias = false;             // q/k/v biases only (Qwen2)
  bool qk_norm = false;              // Qwen3, Gemma 3: the norm over head_dim of each query and key head, before rotary
  bool qk_norm_per_head_weight = false;  // Cohere's use_qk_norm: that norm's weight is [heads, head_dim], a row a head
  bool qk_norm_full_width = false;   // OLMo2: q_norm / k_norm over all heads' q / k (before the head split)
  int64_t sliding_window = 0;        // > 0: a query sees the last sliding_window keys (itself included)
  std::vector<bool> sliding_layers;  // which layers slide (empty: all, when sliding_window > 0)
  double scale = 0.0;                // the softmax scale (0: head_dim^-1/2): Granite's attention_multiplier,
                                     // Gemma's query_pre_attn_scalar^-1/2
  double attn_logit_softcapping = 0.0;  // Gemma 2: scores = cap * tanh(scores / cap) (0: off)
  double clip_qkv = 0.0;             // OLMo: q, k, v clamped to [-c, c] (0: off)
  bool operator==(const AttentionConfig&) const = default;
};

struct NormConfig {
  NormKind kind = NormKind::rms;
  double rms_norm_eps = 1e-5;        // every norm's epsilon (the family's own key: norm_epsilon, layer_norm_eps)
  bool bias = false;                 // NormKind::layer_norm: with bias
  LayerKind placement = LayerKind::pre_norm;  // where a layer's norms sit around attention and the MLP
  bool operator==(const NormConfig&) const = default;
};

struct MlpConfig {
  MlpKind kind = MlpKind::gated;
  std::string hidden_act = "silu";   // silu, gelu_pytorch_tanh, gelu
  bool mlp_bias = false;             // gate/up/down biases
  bool operator==(const MlpConfig&) const = default;
};

struct RotaryConfig {
  double rope_theta = 500000.0;      // Llama-3's
  RopeScaling rope_scaling;
  double local_theta = 0.0;          // Gemma 3: sliding layers' rotary base (default rope; 0: as the others)
  bool interleaved = false;          // Cohere: rotary pairs (2i, 2i+1) instead of (i, i + d/2)
  bool on_sliding_only = false;      // Cohere 2: full-attention layers have no rotary embedding
  // Precision (a no-op in fp32). The tables are computed in fp32, then cast to the activations' dtype
  // (cos.to(x.dtype)) and q, k rotated in it, except:
  bool fp32_tables = false;          // OLMo 1/2: the tables stay fp32, so the rotation runs in fp32, then q, k's dtype
  bool rotate_in_fp32 = false;       // Cohere 1/2: q, k upcast for the rotation (q.float()), with the cast tables
  double partial_rotary_factor = 1.0;  // Phi-4-mini, GLM: rotary on the first head_dim * f dims of each head
  // Phi-3's original_max_position_embeddings (0: none). inference/generate.h: once a sequence's width reaches it + 1
  // while the cache holds no more than that, the cache is dropped and the whole sequence recomputed (longrope's
  // long factors).
  int64_t recompute_original_max = 0;
  bool operator==(const RotaryConfig&) const = default;
};

// The multipliers and caps on the residual stream's ends (Gemma, Granite, Cohere).
struct ScalingConfig {
  bool embedding_scale_sqrt_hidden = false;  // Gemma: embeddings * sqrt(hidden), in the activations' dtype
  double embedding_multiplier = 1.0;  // Granite: embeddings * m
  double residual_multiplier = 1.0;   // Granite: h += m * block(h)
  double final_logit_softcapping = 0.0;  // Gemma 2: logits = cap * tanh(logits / cap) (0: off)
  double logits_scaling = 1.0;        // Granite: logits / s
  double logit_scale = 1.0;           // Cohere: logits * s
  bool operator==(const ScalingConfig&) const = default;
};

struct LlamaConfig {
  std::string model_type = "llama";  // the family (llama/families/): what config.json and the export say
  int64_t vocab_size = 256;          // byte-level tokens by default
  int64_t hidden_size = 256;         // torchtitan: dim
  int64_t num_hidden_layers = 4;     // n_layers
  int64_t num_attention_heads = 8;   // n_heads
  int64_t num_key_value_heads = 4;   // n_kv_heads (GQA when < num_attention_heads)
  int64_t intermediate_size = 768;   // the SwiGLU hidden size (torchtitan derives it from ffn_dim_multiplier)
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight
  std::optional<int64_t> pad_token_id;  // config.json's, kept for the export (HF's embedding padding_idx)
  AttentionConfig attention;
  NormConfig norm;
  MlpConfig mlp;
  RotaryConfig rotary;
  ScalingConfig scaling;
  MoeConfig moe;

  int64_t head_dim() const { return attention.head_dim > 0 ? attention.head_dim : hidden_size / num_attention_heads; }
  int64_t rotary_dim() const { return static_cast<int64_t>(static_cast<double>(head_dim()) * rotary.partial_rotary_factor); }
  bool q_bias() const { return attention.attention_bias || attention.qkv_bias; }  // q, k, v
  bool layer_is_moe(int64_t layer) const {
    for (int64_t l : moe.mlp_only_layers) {
      if (l == layer) return false;
    }
    return moe.num_experts > 0 && moe.decoder_sparse_step > 0 && (layer + 1) % moe.decoder_sparse_step == 0;
  }
  // Whether any layer is sparse: one whose layers are all dense (decoder_sparse_step, mlp_only_layers) routes
  // nothing, as in transformers.
  bool has_sparse_layers() const {
    for (int64_t l = 0; l < num_hidden_layers; ++l) {
      if (layer_is_moe(l)) return true;
    }
    return false;
  }
  bool layer_slides(int64_t layer) const {
    return attention.sliding_window > 0 &&
           (attention.sliding_layers.empty() || attention.sliding_layers.at(static_cast<size_t>(layer)));
  }
  // Every field equal (an export read back gives the same config: llama/hf_config.h).
  bool operator==(const LlamaConfig&) const = default;
  // Throws dtensor::Error naming the first inconsistent field.
  void validate() const;
  std::string to_string() const;
};

}  // namespace llama
