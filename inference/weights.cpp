// The three sources of a generating model (weights.h's ModelSource), each built by llama::build_model (llama/build.h:
// the plan cuts the meta model first, then each rank allocates and fills only its shards):
//   --random-init     each rank its part of LlamaForCausalLM::init_weights(seed) (the same weights at every TP degree);
//   --checkpoint D    ours (llama_train --checkpoint-dir D): D/config.json gives the sizes, the newest committed
//                     D/step-N (or D itself when it is one) the weights; each rank reads only its shards
//                     (dtensor::checkpoint::load reshards any saved TP degree);
//   --hf-dir D        HF's save_pretrained layout: D/config.json, then llama::load_hf_llama reads this
//                     rank's slice of each weight from the memory-mapped safetensors.
//   --gguf F          llama.cpp's one-file format: the config from F's metadata, each tensor dequantized by every
//                     rank, which keeps its part (llama::load_gguf_llama; nothing is mapped in place).
// Both loads map in place (dtensor::checkpoint::LoadOptions::map_in_place): a slice that is one contiguous range of
// a file in the model's dtype uses the file's private mapping as its storage (no copy, no zeroed pages; the page
// cache's, shared by the ranks of a host); the others (Shard(1) slices, dtype casts) are copied and their pages given
// back.
// Whatever does not fit (a missing file, sizes or names that differ) is a SourceError: exit 2 on every rank.
#include "inference/weights.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/dtype.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/core/error.h"
#include "dtensor/checkpoint/step_checkpoints.h"
#include "dtensor/mesh/launch_env.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/api/dtensor_api.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/materialize.h"
#include "dtensor/peft/adapter.h"
#include "llama/gguf_weights.h"
#include "llama/hf_config.h"
#include "llama/build.h"
#include "llama/hf_weights.h"
#include "llama/parallelize.h"

namespace fs = std::filesystem;

namespace inference {
namespace {

// The committed checkpoint --checkpoint names: the directory itself, or the newest step-N under it.
std::string checkpoint_to_load(const std::string& dir) {
  if (dtensor::checkpoint::is_checkpoint(dir)) return dir;
  const auto latest = dtensor::checkpoint::latest_step_checkpoint(dir);
  if (!latest) throw SourceError("--checkpoint " + dir + ": no committed checkpoint there (nor a step-N directory in it)");
  return latest->path;
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

// meta_bytes of the model as it will be stored: each Linear weight in its quantized form where one applies (a GGUF
// file's Q4_0 weights: half a byte a value and an fp16 scale per 32; --quantize int8: a byte and an fp32 scale per
// row; int4: half a byte and a scale and a zero in the model's dtype per group), this rank's shard.
int64_t stored_bytes(torch::nn::Module& meta, at::ScalarType dtype, llama::Quantization quantize, int64_t group,
                     const std::set<std::string>& q4_0) {
  int64_t bytes = dtensor::nn::meta_bytes(meta, dtype);
  const int64_t element = static_cast<int64_t>(c10::elementSize(dtype));
  for (const auto& item : meta.named_modules()) {
    auto* linear = dynamic_cast<dtensor::nn::LinearImpl*>(item.value().get());
    if (linear == nullptr) continue;
    const at::Tensor w = dtensor::is_dtensor(linear->weight) ? dtensor::to_local(linear->weight) : linear->weight;
    const int64_t n = w.numel(), rows = w.dim() > 0 ? w.size(0) : 1;
    int64_t stored = n * element;
    if (q4_0.count(item.key() + ".weight")) {
      stored = n / 2 + n / 32 * 2;
    } else if (quantize == llama::Quantization::int8_weight_only) {
      stored = n + rows * 4;
    } else if (quantize == llama::Quantization::int4_weight_only) {
      stored = n / 2 + 2 * (n / group) * element;
    }
    bytes += stored - n * element;
  }
  return bytes;
}

}  // namespace

int64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return -1;
}

namespace {

// Refuses a model whose parameters (this rank's shards and replicas, from the meta model: a dry run of the load)
// times the ranks on this host exceed the host's available memory, before anything is allocated: one clear error,
// not an out-of-memory kill half way through.
// The ranks agree (one all-reduce over the TP mesh), so all refuse or none does.
void check_fits_in_memory(int64_t bytes_per_rank, at::ScalarType dtype, const dtensor::DeviceMesh& tp_mesh) {
  const int64_t available = available_memory();
  // The ranks sharing this host's memory: the launcher's LOCAL_WORLD_SIZE (tprun, torchrun); one without a launcher
  // (a single process, or ranks as threads in a test).
  const int64_t ranks = std::getenv("RANK") != nullptr ? dtensor::LaunchEnv::from_environ().local_world_size : 1;
  at::Tensor refuse = at::scalar_tensor(available >= 0 && bytes_per_rank * ranks > available ? 1 : 0, at::kLong);
  if (tp_mesh.size() > 1) tp_mesh.get_group(0).all_reduce_(refuse, dtensor::ReduceOp::MAX);
  if (refuse.item<int64_t>() == 0) return;
  auto gb = [](int64_t b) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", static_cast<double>(b) / 1e9);
    return std::string(text);
  };
  throw SourceError("the model does not fit in memory: its parameters in " + models::dtype_name(dtype) + " need " +
                    gb(bytes_per_rank) + " GB per rank (this rank's shards and replicas), " + std::to_string(ranks) +
                    " rank(s) on this host need " + gb(bytes_per_rank * ranks) + " GB, and " + gb(available) +
                    " GB are available (MemAvailable): use more ranks on more hosts, or a smaller --dtype");
}

}  // namespace

at::ScalarType model_dtype(const ModelSource& options) {
  try {
    if (!options.gguf.empty()) return models::resolve_dtype(options.dtype, llama::gguf_dtype(options.gguf));
    return models::resolve_dtype(options.dtype, options.random_init ? "" : llama::checkpoint_dtype(config_path(options)));
  } catch (const SourceError&) {
    throw;
  } catch (const std::exception& e) {
    throw SourceError(e.what());
  }
}

llama::LlamaConfig model_config(const ModelSource& options, int64_t tp) {
  try {
    const llama::LlamaConfig config = options.random_init    ? options.model
                                      : !options.gguf.empty() ? llama::config_from_gguf(options.gguf)
                                                              : llama::config_from_hf_json(config_path(options));
    config.validate();
    models::check_computable(model_dtype(options), options.device == "cuda" ? c10::Device(at::kCUDA) : c10::Device(at::kCPU));
    if (tp > 1) llama::inference_plan(config, tp);  // its size checks, before any communication
    if (llama::quantization_from_string(options.quantize) != llama::Quantization::none && !options.lora_adapter.empty()) {
      throw SourceError("--quantize " + options.quantize + " with --lora-adapter: adapters on a quantized base (QLoRA) "
                        "are not supported");
    }
    if (!options.lora_adapter.empty()) {  // the adapter's config read and its targets found, before any communication
      dtensor::peft::find_targets(*llama::meta_model(config), dtensor::peft::load_adapter_config(options.lora_adapter));
    }
    return config;
  } catch (const SourceError&) {
    throw;
  } catch (const std::exception& e) {
    throw SourceError(e.what());
  }
}

llama::LlamaForCausalLM load_model(const ModelSource& options, const llama::LlamaConfig& config,
                                   const dtensor::DeviceMesh& tp_mesh) {
  // llama::build_model: built on the meta device and parallelized there; then each rank allocates only its shards and
  // replicas and fills them (the seeded init's part of each tensor, or the files' slices, mapped in place where a slice
  // is one range of a file): no rank ever holds the whole model.
  llama::BuildOptions build;
  build.parallelize.plan = options.ep > 1 ? llama::TPPlan::ep : llama::TPPlan::inference;
  build.dtype = model_dtype(options);
  build.quantize = llama::quantization_from_string(options.quantize);
  build.quantize_group_size = llama::quantization_group_size(options.quantize);
  build.prepack_weights = options.weights_prepack;
  // On a GPU the caching allocator's out-of-memory error names the sizes; the host check is for host memory.
  if (tp_mesh.device().is_cpu()) {
    const std::set<std::string> q4_0 = options.gguf.empty() || options.gguf_dequantize
                                           ? std::set<std::string>{}
                                           : llama::q4_0_linear_weights(options.gguf);
    build.before_allocation = [&, q4_0](llama::LlamaForCausalLM& meta) {
      check_fits_in_memory(stored_bytes(*meta, build.dtype, build.quantize, build.quantize_group_size, q4_0),
                           build.dtype, tp_mesh);
    };
  }
  if (!options.lora_adapter.empty()) {
    try {
      build.lora = llama::LoraOptions{.config = dtensor::peft::load_adapter_config(options.lora_adapter),
                                      .adapter_dir = options.lora_adapter};
    } catch (const std::exception& e) {
      throw SourceError(e.what());
    }
  }
  const llama::WeightSource source = options.random_init  ? llama::WeightSource::random(options.seed)
                                     : !options.gguf.empty() ? llama::WeightSource::gguf(options.gguf, options.gguf_dequantize)
                                     : !options.hf_dir.empty() ? llama::WeightSource::hf(options.hf_dir, /*map_in_place=*/true)
                                                             : llama::WeightSource::dcp(checkpoint_to_load(options.checkpoint),
                                                                                        /*map_in_place=*/true);
  try {
    return llama::build_model(config, models::ParallelDims::from_mesh(tp_mesh), source, build);
  } catch (const SourceError&) {
    throw;
  } catch (const std::exception& e) {
    throw SourceError(e.what());
  }
}

}  // namespace inference
