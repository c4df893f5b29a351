// The three sources of a generating model (weights.h's ModelSource):
//   --random-init     LlamaForCausalLM::init_weights(seed) on every rank, then the plan shards it (the same
//                     weights at every TP degree);
//   --checkpoint D    ours (llama_train --checkpoint-dir D): D/config.json gives the sizes, the newest committed
//                     D/step-N (or D itself when it is one) the weights; the model is parallelized first and
//                     each rank reads only its shards (dtensor::checkpoint::load reshards any saved TP degree);
//   --hf-dir D        HF's save_pretrained layout: D/config.json, then llama::load_hf_llama copies this
//                     rank's slice of each weight from the memory-mapped safetensors.
// Whatever does not fit (a missing file, sizes or names that differ) is a SourceError: exit 2 on every rank.
#include "inference/weights.h"

#include <filesystem>

#include "common/dtype.h"
#include "train/checkpointing.h"  // train::latest_checkpoint: one home for "which step-N is newest"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/core/error.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/nn/default_device.h"
#include "dtensor/nn/materialize.h"
#include "llama/hf_config.h"
#include "llama/hf_weights.h"
#include "llama/parallelize.h"

namespace fs = std::filesystem;

namespace inference {
namespace {

// The committed checkpoint --checkpoint names: the directory itself, or the newest step-N under it.
std::string checkpoint_to_load(const std::string& dir) {
  if (dtensor::checkpoint::is_checkpoint(dir)) return dir;
  const auto latest = train::latest_checkpoint(dir);
  if (!latest) throw SourceError("--checkpoint " + dir + ": no committed checkpoint there (nor a step-N directory in it)");
  return latest->second;
}

// config.json beside the weights: in the directory, else (a step-N directory) in its parent.
std::string config_path(const ModelSource& options) {
  if (!options.hf_dir.empty()) return (fs::path(options.hf_dir) / "config.json").string();
  const fs::path ckpt = fs::path(checkpoint_to_load(options.checkpoint));
  for (const fs::path& p : {ckpt / "config.json", ckpt.parent_path() / "config.json"}) {
    if (fs::exists(p)) return p.string();
  }
  throw SourceError("--checkpoint " + options.checkpoint + ": no config.json beside it (llama_train writes one)");
}

}  // namespace

at::ScalarType model_dtype(const ModelSource& options) {
  try {
    return models::resolve_dtype(options.dtype, options.random_init ? "" : llama::checkpoint_dtype(config_path(options)));
  } catch (const SourceError&) {
    throw;
  } catch (const std::exception& e) {
    throw SourceError(e.what());
  }
}

llama::LlamaConfig model_config(const ModelSource& options, int64_t tp) {
  try {
    const llama::LlamaConfig config = options.random_init ? options.model : llama::config_from_hf_json(config_path(options));
    config.validate();
    models::check_computable(model_dtype(options), at::kCPU);
    if (tp > 1) llama::inference_plan(config, tp);  // its size checks, before any communication
    return config;
  } catch (const SourceError&) {
    throw;
  } catch (const std::exception& e) {
    throw SourceError(e.what());
  }
}

llama::LlamaForCausalLM load_model(const ModelSource& options, const llama::LlamaConfig& config,
                                   const dtensor::DeviceMesh& tp_mesh) {
  // Built on the meta device and parallelized there; then each rank allocates only its shards and replicas and fills
  // them (the seeded init's part of each tensor, or the checkpoint's slices): no rank ever holds the whole model.
  llama::LlamaForCausalLM model{nullptr};
  {
    dtensor::nn::DefaultDeviceGuard meta(at::kMeta);
    model = llama::LlamaForCausalLM(config);
  }
  try {
    if (tp_mesh.size() > 1 && options.ep > 1) {
      llama::apply_inference_ep(model, tp_mesh);
    } else if (tp_mesh.size() > 1) {
      llama::apply_inference_tp(model, tp_mesh);
    }
  } catch (const dtensor::Error& e) {
    throw SourceError(e.what());
  }
  dtensor::nn::to_empty(*model, at::kCPU, model_dtype(options));
  if (options.random_init) {
    model->init_weights(options.seed);  // the same values at every TP degree
    return model;
  }
  try {
    if (!options.hf_dir.empty()) {
      llama::load_hf_llama(options.hf_dir, model);
    } else {
      // Model entries only: a training checkpoint also holds AdamW state and the data position.
      dtensor::checkpoint::StateDict state = dtensor::checkpoint::module_state_dict(*model);
      dtensor::checkpoint::load(checkpoint_to_load(options.checkpoint), state, {.allow_unused_names = {"state.*", "train.*"}});
    }
  } catch (const SourceError&) {
    throw;
  } catch (const std::exception& e) {
    throw SourceError(e.what());
  }
  return model;
}

}  // namespace inference
