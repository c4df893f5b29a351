// Gemma 3 text (modular_gemma3.py, model_type gemma3_text): Gemma 2 with (1 + w) RMSNorms over head_dim on
// each query and key head, no soft-capping by default, five sliding layers per full one, and the sliding
// layers' own rotary base (rope_parameters.sliding_attention, formerly rope_local_base_freq). Its config's
// attn_logit_softcapping is read but never applied, as in transformers.
#include "llama/families/families.h"

namespace llama::families {

Family gemma3() {
  return {"gemma3_text", "Gemma3ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.attention.qk_norm = true;
            c.attention.sliding_window = 4096;
            if (c.rotary.local_theta == 0) c.rotary.local_theta = 10000.0;  // the sliding layers' default base
            double local = 0;
            if (r.read("rope_local_base_freq", local)) c.rotary.local_theta = local;
            read_gemma2_common(r, c);
            c.attention.attn_logit_softcapping = 0;  // Gemma 3's attention never applies it (only the final cap)
            // Its rope is per layer type in transformers whatever form the file has (older files are converted), and
            // yarn's truncate is read from that outer dict: always true.
            c.rotary.rope_scaling.truncate = true;
            // The older files' pattern (every pattern-th layer full) when there is no layer_types; the saved
            // _sliding_window_pattern is not read back by transformers (its __post_init__ takes only this key).
            int64_t pattern = 6;
            r.read("sliding_window_pattern", pattern);
            r.ignore("_sliding_window_pattern");
            read_layer_types(r, c, pattern);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) { write_gemma2_common(c, j); },
          {.rope_theta = 1000000.0, .max_position_embeddings = 131072, .num_key_value_heads = 4, .tie_word_embeddings = true, .hidden_act = "gelu_pytorch_tanh", .pad_token_id = 0}};
}
DTENSOR_REGISTER_FAMILY(gemma3);

}  // namespace llama::families
