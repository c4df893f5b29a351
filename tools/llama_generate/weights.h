// Where llama_generate's model comes from: one home for "config, weights, plan", so wiring a new source
// is one branch in each of the two functions below.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "llama/config.h"
#include "llama/model.h"
#include "options.h"

namespace llama_generate {

// The model's sizes: the flags' for --random-init (a checkpoint or HF directory carries its own). Runs
// before any communication, on every rank; throws UsageError for a source that cannot be read or does
// not fit the TP degree `tp` (the inference plan's size checks).
llama::LlamaConfig model_config(const GenerateCliOptions& options, int64_t tp);

// The model with `config`, its weights from the source, parallelized by llama::inference_plan over
// `tp_mesh` (nothing when it has one rank). Throws UsageError when the weights do not match the model.
llama::LlamaForCausalLM load_model(const GenerateCliOptions& options, const llama::LlamaConfig& config,
                                   const dtensor::DeviceMesh& tp_mesh);

}  // namespace llama_generate
