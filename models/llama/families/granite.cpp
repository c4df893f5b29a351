// Granite (modular_granite.py): Llama with four multipliers: embeddings * embedding_multiplier, each block's
// output * residual_multiplier before the residual add, attention_multiplier as the softmax scale, and
// logits / logits_scaling.
#include "llama/families/families.h"

namespace llama::families {

Family granite() {
  return {"granite", "GraniteForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            r.read("attention_bias", c.attention.attention_bias);
            r.read("mlp_bias", c.mlp.mlp_bias);
            r.read("embedding_multiplier", c.scaling.embedding_multiplier);
            r.read("residual_multiplier", c.scaling.residual_multiplier);
            r.read("logits_scaling", c.scaling.logits_scaling);
            c.attention.scale = 1.0;  // GraniteConfig's default attention_multiplier
            r.read("attention_multiplier", c.attention.scale);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["attention_bias"] = c.attention.attention_bias;
            j["mlp_bias"] = c.mlp.mlp_bias;
            j["embedding_multiplier"] = c.scaling.embedding_multiplier;
            j["residual_multiplier"] = c.scaling.residual_multiplier;
            j["logits_scaling"] = c.scaling.logits_scaling;
            j["attention_multiplier"] = c.attention.scale;
          },
          {}};
}
DTENSOR_REGISTER_FAMILY(granite);

}  // namespace llama::families
