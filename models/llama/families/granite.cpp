// Granite (modular_granite.py): Llama with four multipliers: embeddings * embedding_multiplier, each block's
// output * residual_multiplier before the residual add, attention_multiplier as the softmax scale, and
// logits / logits_scaling.
#include "llama/families/families.h"

namespace llama::families {

Family granite() {
  return {"granite", "GraniteForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            r.read("attention_bias", c.attention_bias);
            r.read("mlp_bias", c.mlp_bias);
            r.read("embedding_multiplier", c.embedding_multiplier);
            r.read("residual_multiplier", c.residual_multiplier);
            r.read("logits_scaling", c.logits_scaling);
            c.attention_scale = 1.0;  // GraniteConfig's default attention_multiplier
            r.read("attention_multiplier", c.attention_scale);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["attention_bias"] = c.attention_bias;
            j["mlp_bias"] = c.mlp_bias;
            j["embedding_multiplier"] = c.embedding_multiplier;
            j["residual_multiplier"] = c.residual_multiplier;
            j["logits_scaling"] = c.logits_scaling;
            j["attention_multiplier"] = c.attention_scale;
          },
          {}};
}

}  // namespace llama::families
