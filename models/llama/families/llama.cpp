// Llama (transformers' modeling_llama.py): the decoder as llama/model.h builds it. Its options: an explicit
// head_dim, attention_bias (q/k/v/o), mlp_bias (gate/up/down). pretraining_tp is read and ignored, as
// transformers >= 4.45 ignores it (the split matmul it named computes the same product).
#include "llama/families/families.h"

namespace llama::families {

Family llama() {
  return {"llama", "LlamaForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            r.read_or("head_dim", c.attention.head_dim, 0);  // null: hidden / heads
            r.read("attention_bias", c.attention.attention_bias);
            r.read("mlp_bias", c.mlp.mlp_bias);
            r.ignore("pretraining_tp");
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["head_dim"] = c.head_dim();
            j["attention_bias"] = c.attention.attention_bias;
            j["mlp_bias"] = c.mlp.mlp_bias;
          },
          {}};
}
DTENSOR_REGISTER_FAMILY(llama);

}  // namespace llama::families
