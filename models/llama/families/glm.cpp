// GLM-4 (modular_glm.py, model_type glm): Llama with q/k/v biases but none on o_proj, gate/up packed into
// gate_up_proj in the checkpoint, head_dim 128 by default, and GPT-J-style rotary (interleaved pairs) on the
// first half of each head (partial_rotary_factor 0.5 by default).
#include "llama/families/families.h"

namespace llama::families {

Family glm() {
  return {"glm", "GlmForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.rotary.interleaved = true;
            if (!r.json().contains("rope_parameters") || !r.json().at("rope_parameters").contains("partial_rotary_factor")) {
              c.rotary.partial_rotary_factor = 0.5;  // GlmConfig's default
            }
            c.attention.head_dim = 128;
            r.read("head_dim", c.attention.head_dim);
            // GlmConfig keeps a null num_key_value_heads, which its attention cannot run with.
            if (r.is_null("num_key_value_heads")) r.fail("field 'num_key_value_heads' is null (GLM's attention needs it)");
            bool bias = true;  // GlmConfig's attention_bias: on q, k, v only
            r.read("attention_bias", bias);
            c.attention.qkv_bias = bias;
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["head_dim"] = c.head_dim();
            j["attention_bias"] = c.attention.qkv_bias;
            nlohmann::ordered_json& rope = j["rope_parameters"];
            rope["partial_rotary_factor"] = c.rotary.partial_rotary_factor;
          },
          {.rms_norm_eps = 1.5625e-07, .max_position_embeddings = 131072, .num_key_value_heads = 2, .pad_token_id = 151329},
          {.packed_gate_up = true}};
}
DTENSOR_REGISTER_FAMILY(glm);

}  // namespace llama::families
