#include "llama/config.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "dtensor/core/error.h"

namespace llama {

void LlamaConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    DTENSOR_CHECK(v > 0, "dtensor: llama config: ", name, " must be positive, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("hidden_size", hidden_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("intermediate_size", intermediate_size);
  DTENSOR_CHECK(hidden_size % num_attention_heads == 0, "dtensor: llama config: hidden_size ", hidden_size,
                " is not divisible by num_attention_heads ", num_attention_heads);
  DTENSOR_CHECK(head_dim() % 2 == 0, "dtensor: llama config: head_dim ", head_dim(),
                " must be even for rotary embeddings");
  DTENSOR_CHECK(num_attention_heads % num_key_value_heads == 0, "dtensor: llama config: num_attention_heads ",
                num_attention_heads, " is not divisible by num_key_value_heads ", num_key_value_heads);
}

std::string LlamaConfig::to_string() const {
  std::ostringstream s;
  s << "vocab=" << vocab_size << " dim=" << hidden_size << " layers=" << num_hidden_layers
    << " heads=" << num_attention_heads << " kv_heads=" << num_key_value_heads << " ffn=" << intermediate_size
    << " rope_theta=" << rope_theta << (tie_word_embeddings ? " tied" : "");
  return s.str();
}

LlamaConfig config_from_hf_json(const std::string& path) {
  std::ifstream in(path);
  DTENSOR_CHECK(in, "dtensor: llama config: cannot open '", path, "'");
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: llama config: '", path, "' is not valid JSON: ", e.what());
  }
  LlamaConfig c;
  auto read = [&](const char* key, auto& field) {
    if (j.contains(key) && !j[key].is_null()) field = j[key].get<std::decay_t<decltype(field)>>();
  };
  read("vocab_size", c.vocab_size);
  read("hidden_size", c.hidden_size);
  read("num_hidden_layers", c.num_hidden_layers);
  read("num_attention_heads", c.num_attention_heads);
  c.num_key_value_heads = c.num_attention_heads;  // HF's default when the key is absent
  read("num_key_value_heads", c.num_key_value_heads);
  read("intermediate_size", c.intermediate_size);
  read("max_position_embeddings", c.max_position_embeddings);
  read("rope_theta", c.rope_theta);
  // transformers >= 5 keeps the rotary settings under "rope_parameters" (and "rope_scaling" before); only the
  // default (unscaled) rotary embedding is implemented.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || !j[key].is_object()) continue;
    const auto& rope = j[key];
    if (rope.contains("rope_theta")) c.rope_theta = rope["rope_theta"].get<double>();
    const std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
    DTENSOR_CHECK(type == "default", "dtensor: llama config: '", path, "': rope_type '", type,
                  "' is not supported (only 'default')");
  }
  read("rms_norm_eps", c.rms_norm_eps);
  read("tie_word_embeddings", c.tie_word_embeddings);
  c.validate();
  return c;
}

std::string config_to_hf_json(const LlamaConfig& c, const std::string& dtype) {
  nlohmann::ordered_json j = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim()},
      {"hidden_act", "silu"},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", nullptr},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"dtype", dtype},         // transformers >= 5
      {"torch_dtype", dtype}};  // before
  return j.dump(2);
}

}  // namespace llama
