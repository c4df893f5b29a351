// One way to make a model, for every entry point (torchtitan's build on meta, parallelize, init; transformers'
// from_pretrained): training (train::build_model), the dry run's and plan search's real runs, generation and
// serving (inference::load_model), from_pretrained below.
//
//   meta model                     shapes and dtypes only (meta_model); a pipeline stage keeps its layers alone
//   -> model parallel              the TP / EP plan cuts the meta parameters (apply_model_parallel): nothing is sent
//   -> before_allocation(model)    a check on the meta model (inference: does it fit in this host's memory)
//   -> to_empty(device, dtype)     each rank allocates its shards and replicas only
//   -> fill from the source        a seeded init (each rank its part of the same values at every degree), an HF
//                                  directory or a checkpoint of ours (each rank reads only its slices)
//   -> quantization                when asked: the Linear weights to int8 with per-row scales, in place of the
//                                  loaded ones (dtensor/quant/int8_weight_only.h: torchao's numbers, under the plan)
//   -> adapters (LoRA)             when asked: A and B on the targets, the base frozen
//   -> data parallel               DDP's buckets, FSDP's groups and mixed precision take the filled parameters
//
// No rank ever holds the whole model. The plan is a value (ParallelizeConfig::plan), chosen by the caller.
// The plan dry run and the plan search (train/plan_dry_run.h) run the same stages with nothing allocated or filled:
// the model on meta, then parallelize_llama (model parallel, then data parallel) with training's own ParallelDims and
// ParallelizeConfig, on a mesh of ranks that do not exist.
#pragma once

#include <ATen/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/parallel_dims.h"
#include "dtensor/peft/lora.h"
#include "dtensor/mesh/device_mesh.h"
#include "llama/config.h"
#include "llama/model.h"
#include "llama/parallelize.h"
#include "llama/parallelize_pipeline.h"

namespace llama {

// Where the weights come from.
struct WeightSource {
  enum class Kind {
    random_init,  // LlamaForCausalLM::init_weights(seed)
    hf_dir,       // transformers' save_pretrained files: config.json + *.safetensors (load_hf_llama)
    checkpoint,   // a committed dtensor::checkpoint directory (model entries; a training checkpoint's optimizer
                  // state "state.*" and data position "train.*" are left alone)
    gguf,         // a GGUF file of the llama architecture (llama.cpp's): load_gguf_llama
  };
  Kind kind = Kind::random_init;
  std::string path;   // hf_dir, checkpoint
  uint64_t seed = 0;  // random_init
  // hf_dir, checkpoint: a slice that is one contiguous range of a file in the model's dtype takes the file's private
  // mapping as its storage instead of a copy (dtensor::checkpoint::LoadOptions::map_in_place): inference.
  bool map_in_place = false;
  // gguf: every tensor dequantized into the model's dtype (transformers' from_pretrained(gguf_file=...)); false: a
  // Linear weight stored in Q4_0 is kept in that form (an int4 weight of dtensor/quant/int4_weight_only.h, exact)
  // where its kernels run (int4_kernels_available: AVX-512), dequantized elsewhere.
  bool dequantize = false;

  static WeightSource random(uint64_t seed) { return {Kind::random_init, "", seed, false}; }
  static WeightSource hf(std::string dir, bool map_in_place = false) {
    return {Kind::hf_dir, std::move(dir), 0, map_in_place};
  }
  static WeightSource dcp(std::string dir, bool map_in_place = false) {
    return {Kind::checkpoint, std::move(dir), 0, map_in_place};
  }
  static WeightSource gguf(std::string file, bool dequantize = false) {
    return {Kind::gguf, std::move(file), 0, false, dequantize};
  }
};

// LoRA (dtensor/peft/lora.h) once the base weights are in, before data parallel: adapters on config's targets, sharded
// to match their layers' TP styles, their values from adapter_dir (a PEFT adapter directory) or PEFT's init drawn from
// `seed`. The base is frozen (only the adapters require grad: DDP buckets them alone, gradient sync reduces them alone).
struct LoraOptions {
  dtensor::peft::LoraConfig config;
  std::string adapter_dir;  // "": initialized
  uint64_t seed = 0;
};

// How the Linear weights are stored once loaded (torchao's quantize_ configs; llama_generate / serve --quantize).
enum class Quantization {
  none,
  int8_weight_only,  // Int8WeightOnlyConfig: int8 per row, the activations in the model's dtype (W8A16)
  int4_weight_only,  // Int4WeightOnlyConfig: int4 in groups along in_features (W4A16)
};
// "none" | "int8" | "int4" (group size 128, torchao's default) | "int4-32" | "int4-64" | "int4-128" | "int4-256" (the
// flag's values); anything else throws dtensor::Error naming the values there are.
Quantization quantization_from_string(const std::string& name);
// The group size a name gives int4 (128 for "int4"); 0 for the other schemes.
int64_t quantization_group_size(const std::string& name);

struct BuildOptions {
  ParallelizeConfig parallelize;      // the plan and what runs over each dim (parallelize.h)
  at::ScalarType dtype = at::kFloat;  // the parameters'
  // Applied after the weights are in, to every Linear (lm_head included, torchao's default); with LoRA: refused.
  Quantization quantize = Quantization::none;
  int64_t quantize_group_size = 128;  // int4_weight_only's
  std::optional<LoraOptions> lora;
  // Inference: the bf16 Linear weights packed for the CPU's batched GEMM once everything else is applied
  // (dtensor/quant/weight_prepack.h; where its kernel runs, else nothing changes). The weights are then no longer
  // trainable nor savable as they lie.
  bool prepack_weights = false;
  // A pipeline stage (parallelize_pipeline.h): the meta model keeps this stage's layers (and the embeddings or the
  // head where it has them) before the plan; nothing else is ever allocated or read. nullopt: the whole model.
  std::optional<StageLayers> pipeline_stage;
  // Runs on the meta model after the model-parallel plan, before anything is allocated.
  std::function<void(LlamaForCausalLM&)> before_allocation;
};

// The model for `config` over `dims` (its mesh's device; the CPU when dims hold no mesh, at degree 1 everywhere).
// Throws dtensor::Error for a plan that does not fit the model and for weights that do not match it (the loaders'
// errors, on every rank).
LlamaForCausalLM build_model(const LlamaConfig& config, const models::ParallelDims& dims, const WeightSource& source,
                             const BuildOptions& options = {});

// build_model's adapters step alone, on a model parallelized by apply_model_parallel and not yet by
// apply_data_parallel (the dry run builds its meta model so): inject, load or initialize, freeze the base, and the
// gradient sync over the adapters alone where `gradient_sync`.
void add_lora_adapters(LlamaForCausalLM& model, const LoraOptions& lora, bool gradient_sync);

// transformers' from_pretrained(dir, tp_plan=..., torch_dtype=...): config.json's model (any family of
// llama/hf_config.h), parallelized with `plan` (tp_plan_from_string: "hf", HF's base_model_tp_plan; "torchtitan",
// SP and loss parallel; "inference", generation's; "ep", a mixture of experts' experts split over the mesh, every rank
// with the same tokens) on `tp_mesh` when given (and of size > 1), its weights mapped in place where they can be,
// in `dtype` (common/dtype.h: "auto" is config.json's dtype; or "bfloat16", "float16", "float32").
// `dir` may be a GGUF file instead (from_pretrained(dir, gguf_file=...)): llama/gguf_weights.h, "auto" its gguf_dtype.
LlamaForCausalLM from_pretrained(const std::string& dir, const dtensor::DeviceMesh* tp_mesh = nullptr,
                                 const std::string& plan = "hf", const std::string& dtype = "auto");

}  // namespace llama
