// Gemma 2 (modular_gemma2.py): Gemma with four norms per layer (post-attention, pre- and post-feed-forward:
// the sandwich), a softmax scale of query_pre_attn_scalar^-1/2, soft-capped attention scores and final
// logits (cap * tanh(x / cap)), and sliding-window layers alternating with full ones (layer_types; by
// default every other layer slides, the first one included).
#include "llama/families/families.h"

namespace llama::families {

void read_gemma2_common(HfConfigReader& r, LlamaConfig& c) {
  read_gemma_common(r, c, "hidden_activation");
  c.norm.placement = LayerKind::sandwich;
  double scalar = 256;  // Gemma2Config's default
  r.read("query_pre_attn_scalar", scalar);
  c.attention.scale = std::pow(scalar, -0.5);  // as transformers computes it
  r.read_or("attn_logit_softcapping", c.attention.attn_logit_softcapping, 0.0);  // null: off (absent: the class default)
  r.read_or("final_logit_softcapping", c.scaling.final_logit_softcapping, 0.0);
}

void write_gemma2_common(const LlamaConfig& c, nlohmann::ordered_json& j) {
  write_gemma_common(c, j, "hidden_activation");
  j["query_pre_attn_scalar"] = std::llround(1.0 / (c.attention.scale * c.attention.scale));  // an int in HF's config
  auto cap = [](double v) { return v > 0 ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr); };
  j["attn_logit_softcapping"] = cap(c.attention.attn_logit_softcapping);
  j["final_logit_softcapping"] = cap(c.scaling.final_logit_softcapping);
  write_layer_types(c, j);
}

Family gemma2() {
  return {"gemma2", "Gemma2ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.attention.attn_logit_softcapping = 50.0, c.scaling.final_logit_softcapping = 30.0;  // Gemma2Config's defaults
            c.attention.sliding_window = 4096;
            read_gemma2_common(r, c);
            read_layer_types(r, c, /*pattern=*/2);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) { write_gemma2_common(c, j); },
          {.max_position_embeddings = 8192, .num_key_value_heads = 4, .tie_word_embeddings = true, .hidden_act = "gelu_pytorch_tanh", .pad_token_id = 0}};
}
DTENSOR_REGISTER_FAMILY(gemma2);

}  // namespace llama::families
