// Cohere (Command-R, modeling_cohere.py): one LayerNorm (weight only, fp32) feeding attention and the MLP in
// parallel (h + attn(n) + mlp(n)), rotary on interleaved pairs, logits * logit_scale, tied embeddings by
// default. Cohere 2 (modular_cohere2.py): sliding layers (three of every four) and rotary on those only.
#include "llama/families/families.h"

namespace llama::families {

void read_cohere_common(HfConfigReader& r, LlamaConfig& c) {
  c.norm = NormKind::layer_norm_weight_only;
  c.layer = LayerKind::parallel;
  c.rope_interleaved = true;
  r.read("layer_norm_eps", c.rms_norm_eps);
  c.logit_scale = 0.0625;  // CohereConfig's default
  r.read("logit_scale", c.logit_scale);
  r.read("attention_bias", c.attention_bias);
  if (!r.has("tie_word_embeddings")) c.tie_word_embeddings = true;
}

void write_cohere_common(const LlamaConfig& c, nlohmann::ordered_json& j) {
  j.erase("rms_norm_eps");
  j["layer_norm_eps"] = c.rms_norm_eps;
  j["logit_scale"] = c.logit_scale;
  j["attention_bias"] = c.attention_bias;
}

Family cohere() {
  return {"cohere", "CohereForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            read_cohere_common(r, c);
            refuse_unless(r, "use_qk_norm", [](const nlohmann::json& v) { return v.is_boolean() && !v.get<bool>(); },
                          "Command-R+'s per-head q/k LayerNorms");
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            write_cohere_common(c, j);
            j["use_qk_norm"] = false;
          }};
}

Family cohere2() {
  return {"cohere2", "Cohere2ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            read_cohere_common(r, c);
            c.rope_on_sliding_only = true;
            c.sliding_window = 4096;
            // Cohere2Config sets head_dim = hidden / heads whatever config.json says (and saves it).
            int64_t head_dim = 0;
            r.read("head_dim", head_dim);
            r.ignore("sliding_window_pattern");
            read_layer_types(r, c, /*pattern=*/4);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            write_cohere_common(c, j);
            write_layer_types(c, j);
          }};
}

}  // namespace llama::families
