// Qwen2 / Qwen2.5 (transformers' modular_qwen2.py): Llama with biases on q, k and v (not o), and a sliding
// window (use_sliding_window) on the layers layer_types marks "sliding_attention" (by default the layers
// from max_window_layers on).
#include "llama/families/families.h"

namespace llama::families {

void read_qwen2_sliding(HfConfigReader& r, LlamaConfig& c, QwenSliding kind) {
  // Qwen2Config: the window is sliding_window (4096 when absent, none when null) if use_sliding_window, else
  // none; layer_types, when absent or null, slides the layers from max_window_layers (28) on where there is a
  // window (Qwen2-MoE: the even layers below max_window_layers, when use_sliding_window).
  bool use_sliding_window = false;
  int64_t window = 4096, max_window_layers = 28;
  r.read("use_sliding_window", use_sliding_window);
  r.read_or("sliding_window", window, 0);
  r.read("max_window_layers", max_window_layers);
  if (!use_sliding_window) window = 0;
  std::vector<std::string> layer_types;
  r.read_null_as_absent("layer_types", layer_types);
  if (layer_types.empty()) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const bool slides = kind == QwenSliding::qwen2 ? window > 0 && i >= max_window_layers
                                                     : use_sliding_window && (i + 1) % 2 == 1 && i < max_window_layers;
      layer_types.push_back(slides ? "sliding_attention" : "full_attention");
    }
  }
  if (static_cast<int64_t>(layer_types.size()) != c.num_hidden_layers) {
    r.fail("layer_types has " + std::to_string(layer_types.size()) + " entries for " +
           std::to_string(c.num_hidden_layers) + " layers");
  }
  c.attention.sliding_layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  for (size_t i = 0; i < layer_types.size(); ++i) {
    if (layer_types[i] != "full_attention" && layer_types[i] != "sliding_attention") {
      r.fail("layer_types[" + std::to_string(i) + "] '" + layer_types[i] + "' is not full_attention or sliding_attention");
    }
    c.attention.sliding_layers[i] = layer_types[i] == "sliding_attention";
    if (c.attention.sliding_layers[i] && window <= 0) {
      r.fail("layer_types[" + std::to_string(i) + "] is sliding_attention but there is no sliding window "
             "(use_sliding_window false, or sliding_window null or 0)");
    }
  }
  c.attention.sliding_window = window;
}

void write_qwen2_sliding(const LlamaConfig& c, nlohmann::ordered_json& j) {
  j["use_sliding_window"] = c.attention.sliding_window > 0;
  j["sliding_window"] = c.attention.sliding_window > 0 ? nlohmann::ordered_json(c.attention.sliding_window) : nullptr;
  std::vector<std::string> types;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) types.push_back(c.layer_slides(i) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

Family qwen2() {
  return {"qwen2", "Qwen2ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.attention.qkv_bias = true;
            read_qwen2_sliding(r, c, QwenSliding::qwen2);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) { write_qwen2_sliding(c, j); },
          {.max_position_embeddings = 32768, .num_key_value_heads = 32}};
}
DTENSOR_REGISTER_FAMILY(qwen2);

}  // namespace llama::families
