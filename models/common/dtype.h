// The dtype a model computes in: transformers' names ("bfloat16", "float16", "float32") and torch_dtype="auto"
// (the checkpoint's own), one home for every tool's --dtype (llama_generate, serve, llama_train) and for
// llama::from_pretrained.
//
//   at::ScalarType dt = models::resolve_dtype("auto", config.torch_dtype);  // bf16 for a bf16 checkpoint
//   models::check_computable(dt, at::kCPU);                                  // one clear error before loading
//
// A model in dtype D holds its parameters, activations, KV cache and collectives in D; it computes in fp32 exactly
// where transformers does (norms, softmax, rotary tables, router, soft-caps; llama/model.h says where).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>
#include <vector>

namespace models {

// "bfloat16" | "float16" | "float32" (also PyTorch's spellings "torch.bfloat16", ...): the ScalarType. Anything else
// (float8_*, int8, "half", ...) is a dtensor::Error naming it and the choices.
at::ScalarType dtype_from_name(const std::string& name);
// The name transformers writes in config.json: "bfloat16", "float16", "float32"; dtensor::Error for another dtype.
std::string dtype_name(at::ScalarType dtype);

// --dtype: a name above, or "auto": the checkpoint's dtype (config.json's dtype / torch_dtype, as
// from_pretrained(torch_dtype="auto")), float32 when it names none (a random init, an old checkpoint).
at::ScalarType resolve_dtype(const std::string& requested, const std::string& checkpoint_dtype);

// dtensor::Error when `device` cannot compute in `dtype` (a CUDA device without bf16, ...): before any loading.
void check_computable(at::ScalarType dtype, c10::Device device);

// What --dtype takes: "auto", "bfloat16", "float16", "float32".
const std::vector<std::string>& dtype_names();

}  // namespace models
