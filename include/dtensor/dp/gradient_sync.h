// Gradients reduced once: each DTensor parameter's gradient is brought to the parameter's own placements
// as soon as backward has accumulated it, so that clipping and the optimizer find gradients whose
// placements match their parameters and communicate nothing of their own.
//
// Why: a Replicate parameter used on sharded activations (a sequence-parallel norm weight) gets a
// Partial(sum) gradient: each rank holds its sequence shard's contribution. Left Partial, every op that
// reads it all-reduces it again (PyTorch: clipping once, AdamW three times per weight per step). Here:
//   grad Partial, param Replicate  ->  all-reduce (Partial -> Replicate), once, bucketed: the Partial
//                                      gradients of many small Replicate parameters are flattened into one
//                                      buffer per bucket (as DDP's buckets) and reduced by one collective;
//   grad Partial, param Shard(d)   ->  reduce-scatter (Partial -> Shard), at once, alone;
//   grad placements == param's     ->  nothing.
// A bucket is reduced when its last parameter's gradient arrives; a bucket some of whose parameters got
// no gradient in this backward is reduced when the backward ends (an engine callback), so nothing is left
// Partial. Every rank reduces the same buckets in the same order (the same program runs everywhere).
//
// Semantics users see (documented in README "Gradients"): after backward, `param.grad()` of a DTensor
// parameter has the parameter's placements. PyTorch leaves such a gradient Partial(sum); the values are the
// same (the sum it would reduce to), so clipping, AdamW and checkpoints give the same numbers.
//
// Gradient accumulation: set_requires_gradient_sync(module, false) (FSDP2's name; DDP's no_sync) for all
// micro-batches but the last: gradients stay Partial and add up locally (Partial + Partial is local);
// the last backward, with sync on, reduces the sum once.
//
// parallelize_module installs it on the DTensor parameters it creates; call enable_gradient_sync for
// parameters distributed by hand (distribute_module, distribute_tensor).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "dtensor/mesh/device_mesh.h"

namespace dtensor {

struct GradientSyncOptions {
  // Bytes of local gradient per bucket of Replicate parameters (DDP's default, 25 MiB).
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
  // Data parallel (dtensor::replicate, include/dtensor/dp/replicate.h): a 1-D mesh over the
  // data-parallel ranks. Then every parameter that requires grad, DTensor or plain, sits in a bucket, and
  // a bucket, once its gradients have their parameters' placements, is averaged over this mesh by one
  // all-reduce of its flattened local gradients (DDP). The TP placements are untouched: averaging local
  // shards over dp ranks that hold the same shard is averaging the shard.
  std::optional<DeviceMesh> data_parallel_mesh;
  // FSDP2's set_gradient_divide_factor: with data_parallel_mesh, the buckets are summed over it and divided
  // by this factor instead of averaged over its size. Expert parallelism needs it: an expert's gradient
  // already sums the contributions of the tokens of every "ep" rank, so over dp * ep data ranks it is summed
  // over "dp" and divided by dp * ep.
  std::optional<double> gradient_divide_factor = std::nullopt;
};

// Installs gradient reduction on every parameter of `module` that is a DTensor (any parameter with
// data_parallel_mesh), requires grad and has none installed yet. Returns how many parameters it installed on. Parameters registered in `module`
// later (or replaced) are not covered: call it again.
int64_t enable_gradient_sync(torch::nn::Module& module, GradientSyncOptions options = {});
// The same for a list of parameters (one set of buckets over all of them).
int64_t enable_gradient_sync(const std::vector<at::Tensor>& parameters, GradientSyncOptions options = {});

// Removes it from the parameters of `module`: gradients keep the placements backward gives them
// (PyTorch's behaviour).
void disable_gradient_sync(torch::nn::Module& module);

// false: backward leaves gradients as it produces them (Partial ones accumulate locally); true (the
// default): gradients are reduced to their parameters' placements. Applies to the parameters of `module`, and to the
// fully_shard groups that took any of them (FSDP2's set_requires_gradient_sync: unsharded gradients kept and added up,
// reduce-scattered once by the next backward with sync on; include/dtensor/dp/fully_shard.h).
void set_requires_gradient_sync(torch::nn::Module& module, bool requires_gradient_sync);

// Whether `parameter` has gradient reduction installed.
bool has_gradient_sync(const at::Tensor& parameter);

}  // namespace dtensor
