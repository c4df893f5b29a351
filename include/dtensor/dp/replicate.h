// replicate (PyTorch's torch.distributed._composable.replicate, DDP as a function): data parallel without
// sharding. Every rank of the dp mesh dim holds the whole model (or, on a 2-D ("dp", "tp") mesh, the whole
// of its TP shards); each trains on its slice of the global batch, and after backward every gradient is
// averaged over dp:
//
//   grad (any TP placements) --all-reduce AVG over dp--> the gradient of the global batch's mean loss
//
// bucketed as DDP: gradients are flattened into buckets of bucket_cap_bytes (in reverse registration order,
// the order backward produces them) and each bucket is one all-reduce, issued as soon as its last gradient
// arrives. The buckets are gradient_sync's (include/dtensor/dp/gradient_sync.h) with its data-parallel
// stage on: a gradient first reaches its parameter's TP placements, then is averaged over dp.
//
//   auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
//   parallelize_module(model, mesh["tp"], plan);   // TP inside
//   replicate(model, mesh);                        // DDP across (the mesh's "dp" dim)
//
// Parameters are not broadcast: every rank must build the same initial weights (the same seed), as
// llama_train does. Gradient accumulation: set_requires_gradient_sync(module, false) for all micro-batches
// but the last.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>

#include "dtensor/mesh/device_mesh.h"

namespace dtensor {

struct ReplicateOptions {
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;  // DDP's default
};

// `mesh`: a 1-D dp mesh, or a mesh with a dim named "dp" (its other dims are TP's). Replaces any gradient
// sync already installed on `module`'s parameters (parallelize_module's) by one that also averages over dp.
void replicate(torch::nn::Module& module, const DeviceMesh& mesh, ReplicateOptions options = {});

// The data-parallel sub-mesh of `mesh`: `mesh` itself when 1-D, else mesh["dp"] (throws naming the dims when
// there is none).
DeviceMesh data_parallel_mesh(const DeviceMesh& mesh);

}  // namespace dtensor
