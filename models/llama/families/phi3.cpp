// Phi-3 / 3.5 / Phi-4-mini (modeling_phi3.py): Llama with q/k/v packed into qkv_proj and gate/up into
// gate_up_proj in the checkpoint (split on load: llama/hf_weights.h), longrope with short and long factors
// switched at original_max_position_embeddings (a top-level field that overrides the rope's), partial rotary
// (Phi-4-mini), a sliding window on every layer when set, and generate()'s recomputation of the whole
// sequence once it passes original_max_position_embeddings.
#include "llama/families/families.h"

namespace llama::families {

Family phi3() {
  return {"phi3", "Phi3ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            // Phi3Config's original_max_position_embeddings (4096 when absent) replaces the rope's for llama3 / yarn /
            // longrope (transformers' standardize_rope_params), and generate's cache reset happens past it.
            int64_t original = 4096;
            r.read("original_max_position_embeddings", original);
            if (c.rotary.rope_scaling.has_original_max()) c.rotary.rope_scaling.original_max_position_embeddings = original;
            c.rotary.recompute_original_max = original;
            double partial = 0;
            if (r.read("partial_rotary_factor", partial) && partial != c.rotary.partial_rotary_factor) {
              if (c.rotary.partial_rotary_factor != 1.0) r.fail("partial_rotary_factor differs from rope_parameters'");
              c.rotary.partial_rotary_factor = partial;
            }
            r.read_or("sliding_window", c.attention.sliding_window, 0);  // null: full attention
            for (const char* dropout : {"resid_pdrop", "embd_pdrop"}) {
              refuse_unless(r, dropout, [](const nlohmann::json& v) { return v.is_number() && v.get<double>() == 0.0; },
                            "dropout");
            }
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            if (c.rotary.recompute_original_max > 0) j["original_max_position_embeddings"] = c.rotary.recompute_original_max;
            j["sliding_window"] = c.attention.sliding_window > 0 ? nlohmann::ordered_json(c.attention.sliding_window) : nullptr;
          },
          {.rms_norm_eps = 1e-5, .max_position_embeddings = 4096, .pad_token_id = 32000},
          {.packed_qkv = true, .packed_gate_up = true}};
}
DTENSOR_REGISTER_FAMILY(phi3);

}  // namespace llama::families
