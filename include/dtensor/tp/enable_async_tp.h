// enable_async_tp: torchtitan's --parallelism.enable_async_tensor_parallel for eager C++. Where PyTorch
// turns on a compiler pass (micro-pipeline TP) that finds all-gather -> matmul and matmul -> reduce-scatter
// in the traced graph, this pass finds the same two boundaries in a parallelized module tree, from the plan
// that parallelized it, and routes them through the fused ops of async_tp.h:
//
//   SP -> TP  a PrepareModuleInput (or PrepareModuleInputOutput) whose first input goes Shard(d) ->
//             Replicate, or a ColwiseParallel with input_layouts Shard(d) (d not the last dim): the
//             all-gather and the matmuls of the Linear consumers (the module itself, or its direct
//             children) whose weight is Shard(0) on the TP mesh become one fused_all_gather_matmul with
//             one B per consumer (q, k and v; gate and up). The module's forward still receives the
//             gathered input (a Replicate DTensor); a consumer handed exactly that tensor returns its
//             precomputed product (plus its bias), and any other reader of it computes as before.
//   TP -> SP  a RowwiseParallel Linear with output_layouts Shard(d): its matmul and the reduce-scatter of
//             the Partial product become one fused_matmul_reduce_scatter (the Replicate bias is added
//             after it, as the unfused path adds it to the reduced sum).
// Backward runs the conjugate fused op at each site. Consumers whose weight is not Shard(0) on this mesh
// (key/value projections replicated for GQA) read the gathered input as before. Numbers equal the
// synchronous path up to the rounding of chunked matmuls (<= 1e-6 relative on the Llama loss curve).
//
//   parallelize_module(*model, tp_mesh, plan);
//   enable_async_tp(*model, tp_mesh, plan);   // after the plan, as torchtitan's maybe_enable_async_tp
//
// Throws dtensor::Error when the plan has no such boundary (async TP needs sequence parallel: without it
// the boundaries are all-reduces), naming what it looked for. A 1-rank mesh needs nothing: a no-op.
#pragma once

#include <torch/nn/module.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tp/parallelize.h"

namespace dtensor {

// Returns the number of fused sites (modules) installed.
int enable_async_tp(torch::nn::Module& module, const DeviceMesh& tp_mesh, const ParallelizePlan& plan);

}  // namespace dtensor
