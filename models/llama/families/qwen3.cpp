// Qwen3 (transformers' modular_qwen3.py): Qwen2's attention masks, Llama's attention_bias and explicit
// head_dim (128 when absent), and an RMSNorm over head_dim on each query and key head before the rotary
// embedding (q_norm, k_norm).
#include "llama/families/families.h"

namespace llama::families {

Family qwen3() {
  return {"qwen3", "Qwen3ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.attention.qk_norm = true;
            c.attention.head_dim = 128;  // Qwen3Config's default
            r.read("head_dim", c.attention.head_dim);
            r.read("attention_bias", c.attention.attention_bias);
            read_qwen2_sliding(r, c, QwenSliding::qwen2);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j["head_dim"] = c.head_dim();
            j["attention_bias"] = c.attention.attention_bias;
            write_qwen2_sliding(c, j);
          },
          {.max_position_embeddings = 32768, .num_key_value_heads = 32}};
}
DTENSOR_REGISTER_FAMILY(qwen3);

}  // namespace llama::families
