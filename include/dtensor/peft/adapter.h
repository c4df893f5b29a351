// PEFT's adapter files, in and out: a directory with adapter_config.json (LoraConfig's fields) and
// adapter_model.safetensors, whose keys are `base_model.model.<module>.lora_A.weight` / `.lora_B.weight` (PEFT's
// get_peft_model_state_dict: the adapter's name left out). PeftModel.from_pretrained(model, dir) loads what
// save_adapter writes; load_adapter reads what PEFT's save_pretrained writes.
//
//   auto config = dtensor::peft::load_adapter_config(dir);          // throws for what we do not implement
//   dtensor::peft::inject_adapter(*model, config);
//   dtensor::peft::load_adapter_weights(dir, *model);               // each rank its slices
//   ...
//   dtensor::peft::save_adapter(out, *model, {.base_model_name_or_path = hf_dir});   // collective
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "dtensor/peft/lora.h"

namespace dtensor::peft {

struct AdapterInfo {
  std::string base_model_name_or_path;
  std::string task_type = "CAUSAL_LM";
};

// The LoraConfig of dir/adapter_config.json. Throws dtensor::Error naming the file and the field for a missing or
// unreadable file, a peft_type other than LORA, and the options this does not implement (use_dora, a bias other than
// "none", fan_in_fan_out, modules_to_save, rank_pattern / alpha_pattern, layers_to_transform, a regex target_modules).
LoraConfig load_adapter_config(const std::string& dir);

// Copies dir/adapter_model.safetensors into the model's adapters (inject_adapter first), each rank its slices, in
// the adapters' dtype. Every adapter of the model must be in the file with its shape, and every tensor of the file
// must be an adapter of the model; else one error naming the first that is not, and nothing is changed.
void load_adapter_weights(const std::string& dir, torch::nn::Module& model);

// Writes dir/adapter_config.json (adapter_config(model)) and dir/adapter_model.safetensors (every adapter gathered,
// in its dtype). Collective over the world when one is initialized: every rank gathers, rank 0 writes; returns when the
// files are there for every rank.
void save_adapter(const std::string& dir, torch::nn::Module& model, const AdapterInfo& info = {});

}  // namespace dtensor::peft
