// layer_types with a sliding window (Gemma 2 / 3, Cohere 2): which layers slide, as transformers' configs
// derive it when config.json gives no layer_types (every `pattern`-th layer full, the others sliding).
#include "llama/families/families.h"

namespace llama::families {

void read_layer_types(HfConfigReader& r, LlamaConfig& c, int64_t pattern) {
  r.read("sliding_window", c.attention.sliding_window);
  std::vector<std::string> types;
  r.read_null_as_absent("layer_types", types);  // null: derived, as absent
  if (types.empty()) {
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) types.push_back((i + 1) % pattern ? "sliding_attention" : "full_attention");
  }
  if (static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
    r.fail("layer_types has " + std::to_string(types.size()) + " entries for " + std::to_string(c.num_hidden_layers) + " layers");
  }
  c.attention.sliding_layers.clear();
  for (size_t i = 0; i < types.size(); ++i) {
    if (types[i] != "full_attention" && types[i] != "sliding_attention") {
      r.fail("layer_types[" + std::to_string(i) + "] '" + types[i] + "' is not full_attention or sliding_attention");
    }
    c.attention.sliding_layers.push_back(types[i] == "sliding_attention");
  }
  if (c.attention.sliding_window <= 0) {
    for (bool slides : c.attention.sliding_layers) {
      if (slides) r.fail("layer_types has sliding_attention layers but sliding_window is not set");
    }
  }
}

void write_layer_types(const LlamaConfig& c, nlohmann::ordered_json& j) {
  j["sliding_window"] = c.attention.sliding_window > 0 ? nlohmann::ordered_json(c.attention.sliding_window) : nullptr;
  std::vector<std::string> types;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) types.push_back(c.layer_slides(i) ? "sliding_attention" : "full_attention");
  j["layer_types"] = types;
}

void refuse_unless(HfConfigReader& r, const std::string& key, bool (*ok)(const nlohmann::json&), const std::string& why) {
  r.ignore(key);
  if (r.has(key) && !ok(r.json().at(key))) r.fail("field '" + key + "' = " + r.json().at(key).dump() + " is not supported (" + why + ")");
}

}  // namespace llama::families
