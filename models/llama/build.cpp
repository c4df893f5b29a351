#include "llama/build.h"

#include <chrono>
#include <filesystem>

#include "common/dtype.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/core/error.h"
#include "dtensor/mesh/watchdog.h"
#include "dtensor/nn/materialize.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/peft/adapter.h"
#include "dtensor/quant/int4_weight_only.h"
#include "dtensor/quant/int8_weight_only.h"
#include "dtensor/quant/weight_prepack.h"
#include "llama/gguf_weights.h"
#include "llama/hf_config.h"
#include "llama/hf_weights.h"

namespace fs = std::filesystem;

namespace llama {

void add_lora_adapters(LlamaForCausalLM& model, const LoraOptions& lora, bool gradient_sync) {
  dtensor::peft::inject_adapter(*model, lora.config, lora.seed);
  if (!lora.adapter_dir.empty()) dtensor::peft::load_adapter_weights(lora.adapter_dir, *model);
  dtensor::peft::mark_only_lora_as_trainable(*model);
  // The plan's gradient sync covered the base's parameters, which get no gradients now: the adapters' instead (a
  // Replicate A under a Colwise base gets a Partial gradient, reduced once per backward).
  dtensor::disable_gradient_sync(*model);
  if (gradient_sync) dtensor::enable_gradient_sync(*model);
}

int64_t quantization_group_size(const std::string& name) {
  if (name == "int4") return 128;
  for (const int64_t g : {32, 64, 128, 256}) {
    if (name == "int4-" + std::to_string(g)) return g;
  }
  return 0;
}

Quantization quantization_from_string(const std::string& name) {
  if (name == "none") return Quantization::none;
  if (name == "int8") return Quantization::int8_weight_only;
  if (quantization_group_size(name) > 0) return Quantization::int4_weight_only;
  throw DTENSOR_ERROR("dtensor: quantization '", name, "' is not supported: none, int8 (int8 weight-only per row), "
                      "int4 (int4 weight-only, groups of 128), int4-32, int4-64, int4-128, int4-256");
}

LlamaForCausalLM build_model(const LlamaConfig& config, const models::ParallelDims& dims, const WeightSource& source,
                             const BuildOptions& options) {
  // Reading weights, ranks go at their own pace (a slow disk, a cold page cache): the watchdog allows for it.
  const dtensor::watchdog::Phase phase("loading weights", std::chrono::minutes(30));
  LlamaForCausalLM model = meta_model(config);
  if (options.pipeline_stage) keep_stage(model, *options.pipeline_stage);
  apply_model_parallel(model, dims, options.parallelize);  // the plan cuts the meta parameters: nothing is sent
  if (options.before_allocation) options.before_allocation(model);
  const c10::Device device = dims.has_mesh() ? dims.world_mesh().device() : c10::Device(at::kCPU);
  // Untouched pages: what a file's mapping replaces (map_in_place) costs nothing.
  dtensor::nn::to_empty(*model, device, options.dtype);
  switch (source.kind) {
    case WeightSource::Kind::random_init:
      model->init_weights(source.seed);  // each rank its part of the seeded values
      break;
    case WeightSource::Kind::hf_dir:
      load_hf_llama(source.path, model, source.map_in_place);  // each rank its slices of the files
      break;
    case WeightSource::Kind::gguf:
      // Q4_0 kept as stored where the int4 kernels run; elsewhere (no AVX2) dequantized: the same numbers, faster.
      load_gguf_llama(source.path, model, !source.dequantize && dtensor::quant::int4_kernels_available());
      break;
    case WeightSource::Kind::checkpoint: {
      dtensor::checkpoint::StateDict state = dtensor::checkpoint::module_state_dict(*model);
      dtensor::checkpoint::load(source.path, state,
                                {.allow_unused_names = {"state.*", "train.*"}, .map_in_place = source.map_in_place});
      break;
    }
  }
  DTENSOR_CHECK(options.quantize == Quantization::none || !options.lora,
                "dtensor: LoRA adapters on a quantized base (QLoRA) are not supported: leave out the quantization or "
                "the adapter");
  if (options.quantize == Quantization::int8_weight_only) {
    dtensor::quant::quantize_(*model, dtensor::quant::Int8WeightOnlyConfig{});
  } else if (options.quantize == Quantization::int4_weight_only) {
    // A GGUF file's Q4_0 layers are int4 already (quantize_ passes over converted layers).
    dtensor::quant::quantize_(*model, dtensor::quant::Int4WeightOnlyConfig{options.quantize_group_size});
  }
  if (options.lora) add_lora_adapters(model, *options.lora, options.parallelize.gradient_sync);
  if (options.prepack_weights) dtensor::quant::prepack_linear_weights_(*model);  // adapters' layers stay as they are
  apply_data_parallel(model, dims, options.parallelize);  // DDP's buckets and FSDP's groups take the filled parameters
  return model;
}

LlamaForCausalLM from_pretrained(const std::string& dir, const dtensor::DeviceMesh* tp_mesh, const std::string& plan,
                                 const std::string& dtype) {
  BuildOptions options;
  options.parallelize.plan = tp_plan_from_string(plan);
  const models::ParallelDims dims =
      tp_mesh != nullptr && tp_mesh->size() > 1 ? models::ParallelDims::from_mesh(*tp_mesh) : models::ParallelDims{};
  if (is_gguf_file(dir)) {
    options.dtype = models::resolve_dtype(dtype, gguf_dtype(dir));
    models::check_computable(options.dtype, at::kCPU);
    return build_model(config_from_gguf(dir), dims, WeightSource::gguf(dir), options);
  }
  const std::string config_json = (fs::path(dir) / "config.json").string();
  const LlamaConfig config = config_from_hf_json(config_json);
  options.dtype = models::resolve_dtype(dtype, checkpoint_dtype(config_json));
  models::check_computable(options.dtype, at::kCPU);
  return build_model(config, dims, WeightSource::hf(dir, /*map_in_place=*/true), options);
}

}  // namespace llama
