// Cohere (Command-R, modeling_cohere.py): one LayerNorm (weight only, fp32) feeding attention and the MLP in
// parallel (h + attn(n) + mlp(n)), rotary on interleaved pairs, logits * logit_scale, tied embeddings by
// default. Cohere 2 (modular_cohere2.py): sliding layers (three of every four) and rotary on those only.
#include "llama/families/families.h"

namespace llama::families {

void read_cohere_common(HfConfigReader& r, LlamaConfig& c) {
  c.norm.kind = NormKind::layer_norm_weight_only;
  c.norm.placement = LayerKind::parallel;
  c.rotary.interleaved = true;
  c.rotary.rotate_in_fp32 = true;
  r.read("layer_norm_eps", c.norm.rms_norm_eps);
  c.scaling.logit_scale = 0.0625;  // CohereConfig's default
  r.read("logit_scale", c.scaling.logit_scale);
  r.read("attention_bias", c.attention.attention_bias);
}

void write_cohere_common(const LlamaConfig& c, nlohmann::ordered_json& j) {
  j.erase("rms_norm_eps");
  j["layer_norm_eps"] = c.norm.rms_norm_eps;
  j["logit_scale"] = c.scaling.logit_scale;
  j["attention_bias"] = c.attention.attention_bias;
}

Family cohere() {
  return {"cohere", "CohereForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            read_cohere_common(r, c);
            r.read_or("use_qk_norm", c.attention.qk_norm_per_head_weight, false);  // Command-R+; null: off
            c.attention.qk_norm = c.attention.qk_norm_per_head_weight;
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            write_cohere_common(c, j);
            j["use_qk_norm"] = c.attention.qk_norm_per_head_weight;
          },
          {.rope_theta = 500000.0, .rms_norm_eps = 1e-5, .max_position_embeddings = 8192, .tie_word_embeddings = true, .pad_token_id = 0}};
}
DTENSOR_REGISTER_FAMILY(cohere);

Family cohere2() {
  return {"cohere2", "Cohere2ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            read_cohere_common(r, c);
            c.rotary.on_sliding_only = true;
            c.attention.sliding_window = 4096;
            r.read("head_dim", c.attention.head_dim);  // absent: hidden / heads
            // The older files' pattern: with no layer_types, every pattern-th layer is full.
            int64_t pattern = 4;
            r.read("sliding_window_pattern", pattern);
            read_layer_types(r, c, pattern);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            write_cohere_common(c, j);
            j["head_dim"] = c.head_dim();
            write_layer_types(c, j);
          },
          {.rms_norm_eps = 1e-5, .max_position_embeddings = 8192, .tie_word_embeddings = true, .pad_token_id = 0}};
}
DTENSOR_REGISTER_FAMILY(cohere2);

}  // namespace llama::families
