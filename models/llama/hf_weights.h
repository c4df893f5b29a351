// Hugging Face Llama weights in and out: the files of `LlamaForCausalLM.save_pretrained` (config.json and
// model.safetensors, or shards listed by model.safetensors.index.json), read through memory maps.
//
//   llama::LlamaForCausalLM model(llama::config_from_hf_json(dir + "/config.json"));
//   llama::apply_tp(model, tp_mesh);          // or apply_hf_tp: any plan, any TP degree
//   llama::load_hf_llama(dir, model);         // each rank reads only its slice of each weight
//
// or in one call, like transformers' from_pretrained(dir, tp_plan="auto") (llama/build.h, included here):
//
//   auto model = llama::from_pretrained(dir, &tp_mesh);
#pragma once

#include <ATen/core/ScalarType.h>

#include <optional>
#include <string>

#include "dtensor/mesh/device_mesh.h"
#include "llama/hf_config.h"
#include "llama/build.h"  // from_pretrained, which lived here
#include "llama/model.h"

namespace llama {

// Loads the weights in `dir` into `model`, plain or already parallelized: each rank copies only the part of
// each stored weight that its shard covers (dtensor::checkpoint::load, which never materialises a weight the
// rank does not own). The files may be bf16, fp16 or fp32 (converted to the model's dtype). With tied
// embeddings lm_head.weight need not be stored. Checks first that config.json's sizes match the model's and
// that every weight is there with its shape; then one error on every rank and the model is untouched.
// Collective over the world when one is initialized.
// With `map_in_place` (inference: from_pretrained, llama_generate, serve) a weight whose slice on this rank is one
// contiguous range of a file in the model's dtype (TP 1, a Shard(0) slice, a replica) is not copied: the file's
// private mapping is its storage (dtensor::checkpoint::LoadOptions::map_in_place), as transformers' and llama.cpp's
// mmap loading.
void load_hf_llama(const std::string& dir, LlamaForCausalLM& model, bool map_in_place = false);

// Writes `model` (plain or parallelized) as `save_pretrained` does: config.json and model.safetensors in
// `dtype`, by default the model's own (as save_pretrained). Collective: every rank gathers one weight at a time, rank 0 writes it (peak memory near one full
// weight).
void save_hf_llama(const std::string& dir, LlamaForCausalLM& model, std::optional<at::ScalarType> dtype = std::nullopt);

}  // namespace llama
