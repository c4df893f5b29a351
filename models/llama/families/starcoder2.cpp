// StarCoder2 (modeling_starcoder2.py): LayerNorms with bias (norm_epsilon; always, whatever use_bias says), a
// plain GELU MLP (c_fc, c_proj), biases on q/k/v/o and the MLP (use_bias), a sliding window on every layer when
// set, tied embeddings by default.
#include "llama/families/families.h"

namespace llama::families {

Family starcoder2() {
  return {"starcoder2", "Starcoder2ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.norm.kind = NormKind::layer_norm;
            c.mlp.kind = MlpKind::plain;
            r.read("norm_epsilon", c.norm.rms_norm_eps);
            bool bias = true;
            r.read("use_bias", bias);  // the linear layers'; the LayerNorms always have a bias
            c.attention.attention_bias = c.mlp.mlp_bias = bias;
            c.norm.bias = true;
            r.read_or("sliding_window", c.attention.sliding_window, 0);  // null: full attention
            for (const char* dropout : {"residual_dropout", "embedding_dropout"}) {
              refuse_unless(r, dropout, [](const nlohmann::json& v) { return v.is_number() && v.get<double>() == 0.0; },
                            "dropout");
            }
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) {
            j.erase("rms_norm_eps");
            j["norm_epsilon"] = c.norm.rms_norm_eps;
            j["use_bias"] = c.attention.attention_bias;
            j["sliding_window"] = c.attention.sliding_window > 0 ? nlohmann::ordered_json(c.attention.sliding_window) : nullptr;
          },
          {.rms_norm_eps = 1e-5, .max_position_embeddings = 4096, .num_key_value_heads = 2, .tie_word_embeddings = true, .hidden_act = "gelu_pytorch_tanh"}};
}
DTENSOR_REGISTER_FAMILY(starcoder2);

}  // namespace llama::families
