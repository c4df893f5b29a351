// What the families' files share. Each family is a short file of its differences from Llama (as transformers'
// modular_<family>.py files are) that registers itself (DTENSOR_REGISTER_FAMILY, llama/hf_config.h):
// llama.cpp, mistral.cpp, qwen2.cpp, qwen3.cpp, gemma.cpp, gemma2.cpp, gemma3.cpp, granite.cpp, starcoder2.cpp,
// olmo.cpp (OLMo, OLMo2), cohere.cpp (Cohere, Cohere 2), phi3.cpp, glm.cpp, moe_families.cpp (Mixtral, Qwen2-MoE,
// Qwen3-MoE). hf_config.cpp reads what they share; each family reads and writes its own fields.
#pragma once

#include <cmath>

#include "llama/hf_config.h"

namespace llama::families {

// Mistral's fields, which Mixtral shares (with another default window: none).
void read_mistral_common(HfConfigReader& r, LlamaConfig& c);
// Shared by Qwen2 and Qwen3 (Qwen3's modular file inherits Qwen2's attention masks).
enum class QwenSliding { qwen2, qwen2_moe };  // how layer_types is derived when absent
void read_qwen2_sliding(HfConfigReader& r, LlamaConfig& c, QwenSliding kind);
void write_qwen2_sliding(const LlamaConfig& c, nlohmann::ordered_json& j);
// Gemma's fields (act_key: "hidden_act" in Gemma, "hidden_activation" in Gemma 2 / 3), and Gemma 2's, which
// Gemma 3 inherits.
void read_gemma_common(HfConfigReader& r, LlamaConfig& c, const char* act_key);
void write_gemma_common(const LlamaConfig& c, nlohmann::ordered_json& j, const char* act_key);
void read_gemma2_common(HfConfigReader& r, LlamaConfig& c);
void write_gemma2_common(const LlamaConfig& c, nlohmann::ordered_json& j);
void read_cohere_common(HfConfigReader& r, LlamaConfig& c);
void write_cohere_common(const LlamaConfig& c, nlohmann::ordered_json& j);
// layer_types and sliding_window (layer_types.cpp): when config.json has no layer_types, every pattern-th
// layer is full and the others slide, as Gemma 2 (2), Gemma 3 (6) and Cohere 2 (4) derive them.
void read_layer_types(HfConfigReader& r, LlamaConfig& c, int64_t pattern);
void write_layer_types(const LlamaConfig& c, nlohmann::ordered_json& j);
// Reads `key` and refuses any value but the ones `ok` accepts (null is accepted), naming the field and why.
void refuse_unless(HfConfigReader& r, const std::string& key, bool (*ok)(const nlohmann::json&), const std::string& why);

}  // namespace llama::families
