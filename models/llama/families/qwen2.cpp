// Qwen2 / Qwen2.5 (transformers' modular_qwen2.py): Llama with biases on q, k and v (not o), and a sliding
// window (use_sliding_window) on the layers layer_types marks "sliding_attention" (by default the layers
// from max_window_layers on).
#include "llama/families/families.h"

namespace llama::families {

void read_qwen2_sliding(HfConfigReader& r, LlamaConfig& c) {
  bool use_sliding_window = false;
  int64_t window = 0, max_window_layers = 0;
  r.read("use_sliding_window", use_sliding_window);
  r.read("sliding_window", window);
  const bool has_max = r.read("max_window_layers", max_window_layers);
  std::vector<std::string> layer_types;
  r.read("layer_types", layer_types);
  c.sliding_window = use_sliding_window ? window : 0;
  if (c.sliding_window == 0) return;
  c.sliding_layers.assign(static_cast<size_t>(c.num_hidden_layers), false);
  if (layer_types.empty()) {
    if (!has_max) r.fail("use_sliding_window needs layer_types or max_window_layers");
    for (int64_t i = max_window_layers; i < c.num_hidden_layers; ++i) c.sliding_layers[static_cast<size_t>(i)] = true;
    return;
  }
  if (static_cast<int64_t>(layer_types.size()) != c.num_hidden_layers) {
    r.fail("layer_types has " + std::to_string(layer_types.size()) + " entries for " +
           std::to_string(c.num_hidden_layers) + " layers");
  }
  for (size_t i = 0; i < layer_types.size(); ++i) {
    if (layer_types[i] != "full_attention" && layer_types[i] != "sliding_attention") {
      r.fail("layer_types[" + std::to_string(i) + "] '" + layer_types[i] + "' is not full_attention or sliding_attention");
    }
    c.sliding_layers[i] = layer_types[i] == "sliding_attention";
  }
}

void write_qwen2_sliding(const LlamaConfig& c, nlohmann::ordered_json& j) {
  j["use_sliding_window"] = c.sliding_window > 0;
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
  std::vector<std::string> types;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) types.push_back(c.layer_slides(i) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

Family qwen2() {
  return {"qwen2", "Qwen2ForCausalLM",
          [](HfConfigReader& r, LlamaConfig& c) {
            c.qkv_bias = true;
            read_qwen2_sliding(r, c);
          },
          [](const LlamaConfig& c, nlohmann::ordered_json& j) { write_qwen2_sliding(c, j); }};
}

}  // namespace llama::families
