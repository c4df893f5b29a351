// Mistral (transformers' modular_mistral.py): Llama without biases, with a sliding window on every layer:
// a query at cache index i sees the keys at indices j with i - sliding_window < j <= i.
#include "llama/families/families.h"

namespace llama::families {

Family mistral() {
  return {"mistral", "MistralForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            r.read("head_dim", c.explicit_head_dim);
            r.read("sliding_window", c.sliding_window);  // null: full attention
            if (r.has("layer_types")) r.fail("layer_types is Ministral's (alternating windows), not Mistral's");
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["head_dim"] = c.head_dim();
            j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
          }};
}

}  // namespace llama::families
