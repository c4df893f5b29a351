// Gemma (transformers' modular_gemma.py): Llama with RMSNorm (1 + w) computed in fp32, GeGLU
// (gelu_pytorch_tanh), embeddings times sqrt(hidden) in their dtype, head_dim 256 and tied embeddings by
// default. Gemma 2 and 3 start from here (gemma2.cpp, gemma3.cpp).
#include "llama/families/families.h"

namespace llama::families {

void read_gemma_common(HfConfigReader& r, LlamaConfig& c, const char* act_key) {
  c.norm.kind = NormKind::rms_one_plus;
  c.scaling.embedding_scale_sqrt_hidden = true;
  c.mlp.hidden_act = "gelu_pytorch_tanh";
  r.read(act_key, c.mlp.hidden_act);
  if (std::string(act_key) == "hidden_act" && c.mlp.hidden_act == "gelu") c.mlp.hidden_act = "gelu_pytorch_tanh";  // as GemmaConfig
  if (c.mlp.hidden_act != "gelu_pytorch_tanh" && c.mlp.hidden_act != "gelu" && c.mlp.hidden_act != "silu") {
    r.fail(std::string(act_key) + " '" + c.mlp.hidden_act + "' is not supported (gelu_pytorch_tanh, gelu, silu)");
  }
  c.attention.head_dim = 256;  // GemmaConfig's default
  r.read("head_dim", c.attention.head_dim);
  r.read("attention_bias", c.attention.attention_bias);
  refuse_unless(r, "use_bidirectional_attention", [](const nlohmann::json& v) { return v.is_boolean() && !v.get<bool>(); },
                "bidirectional attention");
}

void write_gemma_common(const LlamaConfig& c, nlohmann::ordered_json& j, const char* act_key) {
  j.erase("hidden_act");
  j[act_key] = c.mlp.hidden_act;
  j["head_dim"] = c.head_dim();
  j["attention_bias"] = c.attention.attention_bias;
}

Family gemma() {
  return {"gemma", "GemmaForCausalLM", [](HfConfigReader& r, LlamaConfig& c) { read_gemma_common(r, c, "hidden_act"); },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) { write_gemma_common(c, j, "hidden_act"); },
          {.max_position_embeddings = 8192, .num_key_value_heads = 16, .tie_word_embeddings = true, .hidden_act = "gelu_pytorch_tanh", .pad_token_id = 0}};
}
DTENSOR_REGISTER_FAMILY(gemma);

}  // namespace llama::families
