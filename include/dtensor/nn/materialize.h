// Building a model on the meta device and giving each rank only its shards (torchtitan's
// `with torch.device("meta")` + `to_empty` + `init_weights`; transformers' per-rank loading):
//
//   dtensor::nn::DefaultDeviceGuard meta(at::kMeta);   // the model's parameters cost nothing
//   Model model(config);
//   parallelize_module(*model, mesh, plan);            // a meta parameter is cut, never sent (distribute_tensor)
//   dtensor::nn::to_empty(*model, at::kCPU);            // each rank allocates its local shards and its replicas
//   ...fill them: a checkpoint's slices, or copy_from_full_ from a seeded full value...
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <torch/nn/module.h>

namespace dtensor::nn {

// PyTorch's Module.to_empty(device=...): every parameter and buffer on the meta device (a plain tensor, or a DTensor
// whose local shard is meta) gets uninitialized storage of its local shape and dtype on `device`; a DTensor keeps its
// spec (mesh, placements, global shape) and a parameter its requires_grad. A tensor registered in two places (tied
// embeddings) stays one tensor. Tensors not on meta are left as they are. With `dtype`, floating tensors are allocated
// in it (Module.to_empty then .to(dtype), without ever holding the first dtype's storage). A parameter's post-accumulate-grad
// hook (a TP plan's gradient sync) moves to its replacement; gradient hooks (register_hook) are refused. State that holds
// the parameters themselves (DDP's buckets, FSDP's groups) must come after: apply data parallel to the materialized
// model. Returns the bytes allocated on this rank.
int64_t to_empty(torch::nn::Module& module, at::Device device, std::optional<at::ScalarType> dtype = std::nullopt);

// The bytes to_empty(module, device, dtype) would allocate on this rank for its meta tensors (each counted once): the
// dry run of a load, before any memory is taken.
int64_t meta_bytes(torch::nn::Module& module, std::optional<at::ScalarType> dtype = std::nullopt);

// dst = this rank's part of `full`, the value of the whole tensor (global shape): for a DTensor its local shard
// (Shard: the rows this rank holds; Replicate: all of it; Partial: the value on one rank, zeros on the others, as
// distribute_tensor makes it), cut locally with no communication; for a plain tensor all of it. The same seeded
// full value gives the same parameters at every TP degree. Throws dtensor::Error when the shapes differ.
void copy_from_full_(const at::Tensor& dst, const at::Tensor& full);

}  // namespace dtensor::nn
