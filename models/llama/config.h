// The Llama-3 model's sizes (HF's LlamaConfig fields, torchtitan's names in comments).
#pragma once

#include <cstdint>
#include <string>

namespace llama {

struct LlamaConfig {
  int64_t vocab_size = 256;          // byte-level tokens by default
  int64_t hidden_size = 256;         // torchtitan: dim
  int64_t num_hidden_layers = 4;     // n_layers
  int64_t num_attention_heads = 8;   // n_heads
  int64_t num_key_value_heads = 4;   // n_kv_heads (GQA when < num_attention_heads)
  int64_t intermediate_size = 768;   // the SwiGLU hidden size (torchtitan derives it from ffn_dim_multiplier)
  int64_t max_position_embeddings = 2048;
  double rope_theta = 500000.0;      // Llama-3's
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Throws dtensor::Error naming the first inconsistent field.
  void validate() const;
  std::string to_string() const;
};

// Reads the fields above from an HF config.json (absent fields keep their defaults).
LlamaConfig config_from_hf_json(const std::string& path);
// The config.json that transformers' save_pretrained writes for `config` (model_type "llama"; `dtype` is
// HF's name: "float32", "bfloat16", "float16").
std::string config_to_hf_json(const LlamaConfig& config, const std::string& dtype = "float32");

}  // namespace llama
