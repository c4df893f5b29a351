// The families, each a short file of its differences from Llama (as transformers' modular_<family>.py
// files are). hf_config.cpp reads what they share; each family reads and writes its own fields.
#pragma once

#include "llama/hf_config.h"

namespace llama::families {

Family llama();    // LlamaForCausalLM: Llama 1-3.3, TinyLlama, SmolLM, Vicuna, ...
Family mistral();  // MistralForCausalLM: a sliding window over the keys
Family qwen2();    // Qwen2ForCausalLM: q/k/v biases; sliding window on the layers layer_types names
Family qwen3();    // Qwen3ForCausalLM: Qwen2 with q/k RMSNorm per head and Llama's attention_bias

// Shared by Qwen2 and Qwen3 (Qwen3's modular file inherits Qwen2's attention masks).
void read_qwen2_sliding(HfConfigReader& r, LlamaConfig& c);
void write_qwen2_sliding(const LlamaConfig& c, nlohmann::ordered_json& j);

}  // namespace llama::families
