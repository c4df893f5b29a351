#include "llama/config.h"

#include <sstream>

#include "dtensor/core/error.h"

namespace llama {

void LlamaConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    DTENSOR_CHECK(v > 0, "dtensor: llama config: ", name, " must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("intermediate_size", intermediate_size);
  DTENSOR_CHECK(attention.head_dim > 0 || hidden_size % num_attention_heads == 0, "dtensor: llama config: hidden_size ",
                hidden_size, " is not divisible by num_attention_heads ", num_attention_heads, " (and no head_dim is given)");
  DTENSOR_CHECK(rotary.partial_rotary_factor > 0 && rotary.partial_rotary_factor <= 1, "dtensor: llama config: partial_rotary_factor ",
                rotary.partial_rotary_factor, " must be in (0, 1]");
  DTENSOR_CHECK(rotary_dim() % 2 == 0, "dtensor: llama config: the rotary dims (head_dim ", head_dim(),
                " * partial_rotary_factor ", rotary.partial_rotary_factor, " = ", rotary_dim(), ") must be even");
  DTENSOR_CHECK(num_attention_heads % num_key_value_heads == 0, "dtensor: llama config: num_attention_heads ",
                num_attention_heads, " is not divisible by num_key_value_heads ", num_key_value_heads);
  DTENSOR_CHECK(attention.sliding_window >= 0, "dtensor: llama config: sliding_window must be positive, got ", attention.sliding_window);
  DTENSOR_CHECK(attention.sliding_layers.empty() || static_cast<int64_t>(attention.sliding_layers.size()) == num_hidden_layers,
                "dtensor: llama config: layer_types has ", attention.sliding_layers.size(), " entries for ", num_hidden_layers,
                " layers");
  DTENSOR_CHECK(mlp.hidden_act == "silu" || mlp.hidden_act == "gelu_pytorch_tanh" || mlp.hidden_act == "gelu",
                "dtensor: llama config: hidden_act '", mlp.hidden_act, "' is not supported (silu, gelu_pytorch_tanh, gelu)");
  DTENSOR_CHECK(!norm.bias || norm.kind == NormKind::layer_norm, "dtensor: llama config: a norm bias needs NormKind::layer_norm");
  DTENSOR_CHECK(!(attention.qk_norm && attention.qk_norm_full_width), "dtensor: llama config: qk_norm is per head or full width, not both");
  DTENSOR_CHECK(!attention.qk_norm_per_head_weight || attention.qk_norm, "dtensor: llama config: qk_norm_per_head_weight needs qk_norm");
  DTENSOR_CHECK(!rotary.on_sliding_only || attention.sliding_window > 0,
                "dtensor: llama config: rotary on sliding layers only needs a sliding window");
  if (moe.num_experts > 0) positive("decoder_sparse_step", moe.decoder_sparse_step);
  if (has_sparse_layers()) {  // the experts' checks
    positive("num_experts", moe.num_experts);
    positive("moe_intermediate_size", moe.intermediate_size);
    DTENSOR_CHECK(moe.top_k > 0 && moe.top_k <= moe.num_experts, "dtensor: llama config: num_experts_per_tok ", moe.top_k,
                  " must be in [1, num_experts = ", moe.num_experts, "]");
    DTENSOR_CHECK(mlp.kind == MlpKind::gated, "dtensor: llama config: experts are gated MLPs");
    DTENSOR_CHECK(!mlp.mlp_bias, "dtensor: llama config: experts have no biases");
  }
  const RopeScaling& r = rotary.rope_scaling;
  if (r.rope_type == "longrope") {
    const size_t half = static_cast<size_t>(rotary_dim() / 2);
    DTENSOR_CHECK(r.short_factor.size() == half && r.long_factor.size() == half, "dtensor: llama config: longrope's ",
                  "short_factor and long_factor need rotary dims / 2 = ", half, " entries, got ", r.short_factor.size(),
                  " and ", r.long_factor.size());
  }
  if (!r.freq_factors.empty()) {
    DTENSOR_CHECK(r.rope_type == "default", "dtensor: llama config: rope freq_factors (a GGUF's rope_freqs) go with rope_type "
                  "default, not '", r.rope_type, "'");
    DTENSOR_CHECK(r.freq_factors.size() == static_cast<size_t>(rotary_dim() / 2), "dtensor: llama config: rope ",
                  "freq_factors (a GGUF's rope_freqs) need rotary dims / 2 = ", rotary_dim() / 2, " entries, got ",
                  r.freq_factors.size());
  }
}

std::string LlamaConfig::to_string() const {
  std::ostringstream s;
  s << model_type << " vocab=" << vocab_size << " dim=" << hidden_size << " layers=" << num_hidden_layers
    << " heads=" << num_attention_heads << " kv_heads=" << num_key_value_heads << " head_dim=" << head_dim()
    << " ffn=" << intermediate_size << " rope_theta=" << rotary.rope_theta;
  if (rotary.rope_scaling.rope_type != "default") s << " rope=" << rotary.rope_scaling.rope_type;
  if (attention.attention_bias) s << " attention_bias";
  if (attention.qkv_bias) s << " qkv_bias";
  if (mlp.mlp_bias) s << " mlp_bias";
  if (attention.qk_norm) s << (attention.qk_norm_per_head_weight ? " qk_norm_per_head_weight" : " qk_norm");
  if (attention.qk_norm_full_width) s << " qk_norm_full_width";
  if (rotary.partial_rotary_factor != 1.0) s << " partial_rotary=" << rotary.partial_rotary_factor;
  if (rotary.interleaved) s << " rope_interleaved";
  if (mlp.hidden_act != "silu") s << " act=" << mlp.hidden_act;
  if (norm.placement == LayerKind::sandwich) s << " sandwich_norms";
  if (norm.placement == LayerKind::post_norm) s << " post_norms";
  if (norm.placement == LayerKind::parallel) s << " parallel_block";
  if (mlp.kind == MlpKind::plain) s << " plain_mlp";
  if (attention.attn_logit_softcapping > 0) s << " attn_softcap=" << attention.attn_logit_softcapping;
  if (scaling.final_logit_softcapping > 0) s << " logit_softcap=" << scaling.final_logit_softcapping;
  if (attention.sliding_window > 0) s << " sliding_window=" << attention.sliding_window;
  if (has_sparse_layers()) {
    s << " experts=" << moe.num_experts << " top_k=" << moe.top_k << " expert_ffn=" << moe.intermediate_size;
    if (moe.shared_expert_intermediate_size > 0) s << " shared_expert=" << moe.shared_expert_intermediate_size;
  }
  if (tie_word_embeddings) s << " tied";
  return s.str();
}

}  // namespace llama
