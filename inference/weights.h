// Where a generating or served model comes from (llama_generate, serve): one home for "config, weights, plan", so
// wiring a new source is one branch in each of the two functions below.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dtensor/mesh/device_mesh.h"
#include "llama/config.h"
#include "llama/model.h"

namespace inference {

// Exactly one source: a checkpoint of ours, an HF directory, a GGUF file, or a seeded random init of `model`'s sizes.
struct ModelSource {
  std::string checkpoint;      // our checkpoint directory (llama_train --checkpoint-dir)
  std::string hf_dir;          // HF weights: config.json + *.safetensors
  std::string gguf;            // a GGUF file (llama.cpp's): the config from its metadata, its tensors in --dtype
  // --gguf-dequantize: every GGUF tensor dequantized into --dtype (transformers' loading); else a Q4_0 Linear weight
  // stays in its stored form (llama::WeightSource::dequantize).
  bool gguf_dequantize = false;
  bool random_init = false;    // LlamaForCausalLM::init_weights(seed), sizes from `model`
  llama::LlamaConfig model;    // random_init's sizes (a checkpoint carries its own)
  uint64_t seed = 0;           // random_init's weights
  int64_t ep = 1;              // > 1: expert parallelism instead of TP (a mixture of experts; ep == world size)
  std::string device = "cpu";  // --device: "cpu", or "cuda" (cuda:LOCAL_RANK; the mesh is made on it)
  std::string dtype = "auto";  // --dtype (common/dtype.h): "auto" is the checkpoint's, float32 for a random init
  // A PEFT adapter directory (adapter_config.json + adapter_model.safetensors) on top of the weights, as
  // PeftModel.from_pretrained(model, dir): its adapters sharded like their layers (dtensor/peft/lora.h). "": none.
  std::string lora_adapter;
  // --quantize: how the Linear weights are stored once loaded (llama::quantization_from_string: "none", "int8":
  // torchao's Int8WeightOnlyConfig, per row; "int4", "int4-G": Int4WeightOnlyConfig(group_size G, 128); sharded with
  // the plan).
  std::string quantize = "none";
  // --no-weights-prepack: false keeps the bf16 Linear weights as loaded (llama::BuildOptions::prepack_weights).
  bool weights_prepack = true;
};

// A source that cannot be read or does not fit the model or the TP degree: the tools print it as one `error:` line
// and exit 2 on every rank.
struct SourceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The dtype the model computes in: source.dtype, "auto" resolved from config.json (float32 for a random init).
at::ScalarType model_dtype(const ModelSource& source);

// MemAvailable of /proc/meminfo in bytes (-1 when it cannot be read).
int64_t available_memory();

// The model's config (random_init: source.model; else the checkpoint's config.json). Runs before any communication,
// on every rank; throws SourceError for a source that cannot be read, a dtype the CPU cannot compute in, or a model
// that does not fit the TP degree `tp` (the inference plan's size checks).
llama::LlamaConfig model_config(const ModelSource& source, int64_t tp);

// The model with `config`, in model_dtype(source), its weights from the source, parallelized by llama::inference_plan over `tp_mesh`
// (nothing when it has one rank), on tp_mesh's device. Throws SourceError when the weights do not match the model.
llama::LlamaForCausalLM load_model(const ModelSource& source, const llama::LlamaConfig& config,
                                   const dtensor::DeviceMesh& tp_mesh);

}  // namespace inference
