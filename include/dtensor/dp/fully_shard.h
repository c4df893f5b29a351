// fully_shard (PyTorch's FSDP2, torch.distributed.fsdp.fully_shard): data parallel that shards parameters,
// gradients and optimizer state over the dp mesh dim. Applied per module, each transformer block first,
// then the root:
//
//   auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
//   parallelize_module(model, mesh["tp"], plan);            // TP first shards each weight ...
//   for (auto& layer : *model->layers) fully_shard(*layer, mesh);
//   fully_shard(*model, mesh);                              // ... then FSDP shards the TP-local shard
//
// Placements. Each parameter becomes a DTensor on the whole mesh: Shard(0) over dp added to its TP
// placement, i.e. rank (i, j) holds dp-chunk i (torch.chunk of dim 0) of its TP-local tensor:
//   TP Replicate (norms) or plain        ->  (Shard(0), Replicate())
//   TP Shard(1) (rowwise weights)        ->  (Shard(0), Shard(1))
//   TP Shard(0) (colwise, embeddings)    ->  (_StridedShard(0, sf=tp), Shard(0))  -- dp splits after tp
// so full_tensor(), checkpoints and the optimizer see honest DTensors. On a 1-D dp mesh, plain parameters
// become (Shard(0)).
//
// Per module and step (a module's parameters = those under it that no earlier fully_shard took):
//   forward pre-hook   one all-gather over dp of all its shards in one flat buffer (padded to equal
//                      chunks) -> the TP-local parameters, which its forward reads (layer member handles);
//   forward hook       with reshard_after_forward (not for the root, whose backward comes at once): the
//                      gathered storage is freed; a hook on the output's gradient gathers it again just
//                      before the module's backward;
//   backward           the gathered parameters' gradients (first brought to their TP placements:
//                      Partial -> Replicate = all-reduce) are reduce-scattered over dp in one flat buffer,
//                      averaged (AVG), into the sharded parameters' .grad, once all arrived (or at the end of
//                      backward); then the gathered storage is freed.
// The optimizer steps the sharded parameters only: parameters, gradients and AdamW state per rank are
// 1/(dp·tp) of the model's (1/dp of the TP-replicated ones).
//
// Prefetch (as FSDP2's implicit prefetching, one module ahead): from the second step on, each module's
// forward starts the next module's all-gather asynchronously, and each module's gather before backward
// starts the previous one's, so that gather runs while this module computes (the order is the first
// forward's; parallel/fsdp_param_group.h).
//
// Mixed precision (FSDP2's MixedPrecisionPolicy, options.mp_policy): the shards stay in their dtype (fp32 masters for
// the optimizer and checkpoints); the all-gather and the gathered parameters forward reads are in param_dtype; the
// gradients (param_dtype) are reduce-scattered in reduce_dtype (default param_dtype) and land in the shards' .grad in
// the shards' dtype; cast_forward_inputs casts each fully_shard module's floating inputs to param_dtype, output_dtype
// its outputs.
//
// Not done: CPU offload.
#pragma once

#include <torch/nn/module.h>

#include "dtensor/dp/mixed_precision.h"
#include "dtensor/mesh/device_mesh.h"

namespace dtensor {

struct FullyShardOptions {
  // Free the gathered parameters after forward and gather again before backward (ZeRO-3); false keeps them
  // from forward to backward (ZeRO-2: one all-gather per step instead of two). The root never frees them
  // after forward.
  bool reshard_after_forward = true;
  // Start the next module's all-gather while this one computes (forward, and backward in reverse). Our
  // name: FSDP2 always prefetches one module ahead. False gathers each module when it runs (the reference
  // path; same numbers).
  bool prefetch = true;
  // FSDP2's mp_policy: param_dtype for the gathered parameters and forward, reduce_dtype for the gradients'
  // reduce-scatter (see above). All unset: everything in the parameters' dtype.
  MixedPrecisionPolicy mp_policy = {};
};

// `mesh`: a 1-D dp mesh (parameters must be plain), or a 2-D ("dp", "tp") mesh whose TP parameters are
// DTensors on mesh["tp"]. Throws if `module` has no parameters left to take.
void fully_shard(torch::nn::Module& module, const DeviceMesh& mesh, FullyShardOptions options = {});

// Whether `parameter` is a sharded parameter of some fully_shard call.
bool is_fully_sharded(const at::Tensor& parameter);

}  // namespace dtensor
