// The families, each a short file of its differences from Llama (as transformers' modular_<family>.py
// files are). hf_config.cpp reads what they share; each family reads and writes its own fields.
#pragma once

#include <cmath>

#include "llama/hf_config.h"

namespace llama::families {

Family llama();    // LlamaForCausalLM: Llama 1-3.3, TinyLlama, SmolLM, Vicuna, ...
Family mistral();  // MistralForCausalLM: a sliding window over the keys
Family qwen2();    // Qwen2ForCausalLM: q/k/v biases; sliding window on the layers layer_types names
Family qwen3();    // Qwen3ForCausalLM: Qwen2 with q/k RMSNorm per head and Llama's attention_bias
Family gemma();    // GemmaForCausalLM: (1 + w) RMSNorm, GeGLU, embeddings * sqrt(hidden)
Family gemma2();   // Gemma2ForCausalLM: Gemma with sandwich norms, soft-capping, alternating sliding layers
Family gemma3();   // Gemma3ForCausalLM (gemma3_text): Gemma 2 with q/k norms and a local rotary base
Family granite();  // GraniteForCausalLM: multipliers on embeddings, residuals, attention and logits
Family starcoder2();  // Starcoder2ForCausalLM: LayerNorm with bias, GELU c_fc / c_proj MLP, biases
Family olmo();     // OlmoForCausalLM: parameter-free LayerNorm, q/k/v clipping
Family olmo2();    // Olmo2ForCausalLM: post-norms, q/k RMSNorm over all heads
Family cohere();   // CohereForCausalLM: parallel block, weight-only LayerNorm, interleaved rotary, logit scale
Family cohere2();  // Cohere2ForCausalLM: Cohere with sliding layers, rotary on those only
Family phi3();     // Phi3ForCausalLM: packed qkv / gate_up, longrope, partial rotary, sliding window
Family glm();      // GlmForCausalLM: q/k/v biases, packed gate_up, interleaved partial rotary
// Mixtures of experts (moe_families.cpp, llama/moe.h):
Family mixtral();    // MixtralForCausalLM: Mistral with a sparse MLP on every layer
Family qwen2_moe();  // Qwen2MoeForCausalLM: Qwen2 with sparse layers and a gated shared expert
Family qwen3_moe();  // Qwen3MoeForCausalLM: Qwen3's attention (head_dim hidden / heads) with sparse layers

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
