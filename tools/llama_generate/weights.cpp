// --random-init: LlamaForCausalLM::init_weights(seed) on every rank, then the plan shards it (the same
// weights at every TP degree). --checkpoint and --hf-dir wait for the checkpoint issue (dtensor::checkpoint,
// llama::load_hf_llama): their branches are where that wiring goes (read the config in model_config; in
// load_model, apply the plan and load the sharded state into the DTensor parameters, or load the HF
// tensors and let the plan shard them).
#include "weights.h"

#include "llama/parallelize.h"

namespace llama_generate {
namespace {

[[noreturn]] void not_available(const GenerateCliOptions& options) {
  const std::string flag = options.checkpoint.empty() ? "--hf-dir" : "--checkpoint";
  throw UsageError(flag + " is not available yet in this build (checkpoint loading is not wired to llama_generate); "
                   "use --random-init");
}

}  // namespace

llama::LlamaConfig model_config(const GenerateCliOptions& options, int64_t tp) {
  if (!options.random_init) not_available(options);
  const llama::LlamaConfig config = options.model;
  try {
    config.validate();
    if (tp > 1) llama::inference_plan(config, tp);  // its size checks, before any communication
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  return config;
}

llama::LlamaForCausalLM load_model(const GenerateCliOptions& options, const llama::LlamaConfig& config,
                                   const dtensor::DeviceMesh& tp_mesh) {
  if (!options.random_init) not_available(options);
  llama::LlamaForCausalLM model(config);
  model->init_weights(options.seed);
  if (tp_mesh.size() > 1) llama::apply_inference_tp(model, tp_mesh);
  return model;
}

}  // namespace llama_generate
