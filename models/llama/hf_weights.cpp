#include "llama/hf_weights.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/api/dtensor_api.h"
#include "llama/hf_config.h"
#include "llama/parallelize.h"

namespace fs = std::filesystem;

namespace llama {
namespace {

// The fields that decide the weights' shapes and meaning must agree; the rest (max positions) may differ.
void check_config(const std::string& dir, const LlamaConfig& file, const LlamaConfig& model) {
  auto check = [&](const char* field, const auto& a, const auto& b) {
    if (a == b) return;
    std::ostringstream s;
    s << "dtensor: load_hf_llama('" << dir << "'): config.json has " << field << " = " << a << ", the model " << b;
    throw DTENSOR_ERROR(s.str());
  };
  check("model_type", file.model_type, model.model_type);
  check("vocab_size", file.vocab_size, model.vocab_size);
  check("hidden_size", file.hidden_size, model.hidden_size);
  check("num_hidden_layers", file.num_hidden_layers, model.num_hidden_layers);
  check("num_attention_heads", file.num_attention_heads, model.num_attention_heads);
  check("num_key_value_heads", file.num_key_value_heads, model.num_key_value_heads);
  check("head_dim", file.head_dim(), model.head_dim());
  check("intermediate_size", file.intermediate_size, model.intermediate_size);
  check("tie_word_embeddings", file.tie_word_embeddings, model.tie_word_embeddings);
  check("attention_bias", file.attention_bias, model.attention_bias);
  check("q/k/v bias", file.q_bias(), model.q_bias());
  check("mlp_bias", file.mlp_bias, model.mlp_bias);
  check("q/k norm", file.qk_norm, model.qk_norm);
  check("rms_norm_eps", file.rms_norm_eps, model.rms_norm_eps);
  check("rope_theta", file.rope_theta, model.rope_theta);
  check("rope_type", file.rope_scaling.rope_type, model.rope_scaling.rope_type);
  check("sliding_window", file.sliding_window, model.sliding_window);
}

std::string hf_dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: throw DTENSOR_ERROR("dtensor: save_hf_llama: dtype ", c10::toString(dtype),
                                 " (use float32, bfloat16 or float16)");
  }
}

}  // namespace

void load_hf_llama(const std::string& dir, LlamaForCausalLM& model) {
  check_config(dir, config_from_hf_json((fs::path(dir) / "config.json").string()), model->config);
  // Parameters only: HF files hold no buffers of ours. A tied lm_head.weight is embed_tokens' tensor, listed
  // once (module_state_dict) under model.embed_tokens.weight; a file may still store lm_head.weight.
  const auto params = model->named_parameters();
  dtensor::checkpoint::StateDict state;
  for (const auto& [name, t] : dtensor::checkpoint::module_state_dict(*model)) {
    if (params.contains(name)) state[name] = t;
  }
  dtensor::checkpoint::load(dir, state, {.allow_unused = model->config.tie_word_embeddings, .allow_dtype_cast = true});
}

void save_hf_llama(const std::string& dir, LlamaForCausalLM& model, at::ScalarType dtype) {
  const std::string dtype_name = hf_dtype_name(dtype);
  const int rank = dtensor::is_initialized() ? dtensor::current_world()->rank() : 0;
  const auto params = model->named_parameters();
  dtensor::checkpoint::StateDict state;
  for (const auto& [name, t] : dtensor::checkpoint::module_state_dict(*model)) {
    if (params.contains(name)) state[name] = t;
  }
  std::vector<dtensor::checkpoint::TensorInfo> layout;
  for (const auto& [name, t] : state) layout.push_back({name, dtype, t.sizes().vec()});
  std::unique_ptr<dtensor::checkpoint::SafetensorsWriter> writer;
  if (rank == 0) {
    fs::create_directories(dir);
    writer = std::make_unique<dtensor::checkpoint::SafetensorsWriter>((fs::path(dir) / "model.safetensors").string(), layout,
                                                                      std::map<std::string, std::string>{{"format", "pt"}});
  }
  {
    at::NoGradGuard no_grad;
    for (const auto& [name, t] : state) {
      // One weight at a time: Shard -> Replicate = all-gather, on every rank; only rank 0 keeps and writes it.
      const at::Tensor full = dtensor::is_dtensor(t) ? dtensor::full_tensor(t.detach()) : t.detach();
      if (writer) writer->write(full.to(dtype));
    }
  }
  if (writer) {
    writer->finish();
    std::ofstream(fs::path(dir) / "config.json") << config_to_hf_json(model->config, dtype_name);
  }
  if (dtensor::is_initialized()) dtensor::current_world()->world_group()->barrier();  // the files are there for all
}

LlamaForCausalLM from_pretrained(const std::string& dir, const dtensor::DeviceMesh* tp_mesh, const std::string& plan) {
  LlamaForCausalLM model(config_from_hf_json((fs::path(dir) / "config.json").string()));
  if (tp_mesh != nullptr && tp_mesh->size() > 1) {
    if (plan == "hf") {
      apply_hf_tp(model, *tp_mesh);
    } else if (plan == "torchtitan") {
      apply_tp(model, *tp_mesh);
    } else if (plan == "inference") {
      apply_inference_tp(model, *tp_mesh);
    } else {
      throw DTENSOR_ERROR("dtensor: from_pretrained: unknown plan '", plan, "' (hf, torchtitan or inference)");
    }
  }
  load_hf_llama(dir, model);
  return model;
}

}  // namespace llama
