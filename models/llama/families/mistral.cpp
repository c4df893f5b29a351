// Mistral (transformers' modular_mistral.py): Llama without biases, with a sliding window on every layer:
// a query at cache index i sees the keys at indices j with i - sliding_window < j <= i.
#include "llama/families/families.h"

namespace llama::families {

void read_mistral_common(HfConfigReader& r, LlamaConfig& c) {
  r.read_or("head_dim", c.attention.head_dim, 0);  // null: hidden / heads
  r.read_or("sliding_window", c.attention.sliding_window, 0);  // null: full attention
  if (r.has("layer_types")) r.fail("layer_types is Ministral's (alternating windows), not Mistral's");
}

Family mistral() {
  return {"mistral", "MistralForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.attention.sliding_window = 4096;  // MistralConfig's default (Mixtral's: none)
            read_mistral_common(r, c);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["head_dim"] = c.head_dim();
            j["sliding_window"] = c.attention.sliding_window > 0 ? nlohmann::ordered_json(c.attention.sliding_window) : nullptr;
          },
          {.max_position_embeddings = 131072, .num_key_value_heads = 8}};
}
DTENSOR_REGISTER_FAMILY(mistral);

}  // namespace llama::families
