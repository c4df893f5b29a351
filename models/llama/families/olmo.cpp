// OLMo (modeling_olmo.py): Llama with LayerNorms without parameters (eps 1e-5, in fp32) and q/k/v clamped
// to [-clip_qkv, clip_qkv], rotary in fp32 (both). OLMo2 (modular_olmo2.py): RMSNorms placed after attention and the MLP (post-norm,
// no input norm) and q/k RMSNorms over all heads' projections (which TP shards: norm.h reduces them).
#include "llama/families/families.h"

namespace llama::families {

Family olmo() {
  return {"olmo", "OlmoForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.norm.kind = NormKind::layer_norm_no_affine;
            c.norm.rms_norm_eps = 1e-5;  // OlmoLayerNorm's fixed eps
            c.rotary.fp32_tables = true;
            r.read("attention_bias", c.attention.attention_bias);
            r.read_or("clip_qkv", c.attention.clip_qkv, 0.0);  // null: no clipping
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j.erase("rms_norm_eps");
            j["attention_bias"] = c.attention.attention_bias;
            j["clip_qkv"] = c.attention.clip_qkv > 0 ? nlohmann::ordered_json(c.attention.clip_qkv) : nullptr;
          },
          {.rms_norm_eps = 1e-5, .pad_token_id = 1}};
}
DTENSOR_REGISTER_FAMILY(olmo);

Family olmo2() {
  return {"olmo2", "Olmo2ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.norm.placement = LayerKind::post_norm;
            c.norm.kind = NormKind::rms_weight_fp32;
            c.attention.qk_norm_full_width = true;
            c.rotary.fp32_tables = true;
            r.read("attention_bias", c.attention.attention_bias);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) { j["attention_bias"] = c.attention.attention_bias; },
          {.rms_norm_eps = 1e-5, .pad_token_id = 1}};
}
DTENSOR_REGISTER_FAMILY(olmo2);

}  // namespace llama::families
