// The DTensor API (PyTorch's torch.distributed.tensor._api): making DTensors and moving them between placements.
// The type itself is dtensor/tensor/dtensor.h; this level sits above redistribute/, which it calls.
//
// A DTensor's sizes() are the global shape; it holds this rank's local shard and its DTensorSpec. It runs
// through autograd, can be an nn parameter (requires_grad, .grad accumulating as a DTensor with the
// parameter's placements, detach, .data, zero_grad). Ops reach it through a dispatch key of its own; an op
// without a sharding rule raises an error naming the op and the input placements.
//
//   auto mesh = dtensor::init_device_mesh("cpu", {4});
//   at::Tensor w = dtensor::distribute_tensor(full_w, mesh, {dtensor::Shard(0)});
//   w.sizes();                        // global shape
//   dtensor::to_local(w);             // this rank's rows
//   dtensor::redistribute(w, mesh, {dtensor::Replicate()});   // all-gather
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/placement.h"

namespace dtensor {

// `tensor` on the source rank (mesh coordinate of global rank src_data_rank) is the truth: other ranks
// receive their shards from it (one broadcast per mesh dim, then a local chunk). With src_data_rank
// nullopt each rank slices its own copy (no communication). Partial placements: the source's value is
// split as Replicate -> Partial does. The result is a leaf; requires_grad follows `tensor`.
at::Tensor distribute_tensor(const at::Tensor& tensor, const DeviceMesh& mesh, Placements placements,
                             std::optional<int> src_data_rank = 0);

// This rank's shard; differentiable (the gradient flows back as a DTensor with the same spec, or with
// grad_placements when given).
at::Tensor to_local(const at::Tensor& dtensor, std::optional<Placements> grad_placements = std::nullopt);

// The global value on every rank: redistribute to all-Replicate, then to_local. Differentiable.
at::Tensor full_tensor(const at::Tensor& dtensor, std::optional<Placements> grad_placements = std::nullopt);

// The same tensor with new placements, moving data with collectives (Shard->Replicate all-gather,
// Partial->Replicate all-reduce, Partial->Shard reduce-scatter, Replicate->Shard local chunk,
// Shard(i)->Shard(j) all-to-all, Replicate->Partial local split). Differentiable. The mesh must be the
// DTensor's mesh.
at::Tensor redistribute(const at::Tensor& dtensor, const DeviceMesh& mesh, Placements placements);
// The same on the DTensor's own mesh: redistribute(w, {Replicate()}).
at::Tensor redistribute(const at::Tensor& dtensor, Placements placements);

struct DTensor {
  // Wraps each rank's `local` as one DTensor. Without `shape`, the global shape is inferred: with
  // run_check, from every rank's local shape (exact, uneven shards allowed); without, as the local shape
  // times the mesh size along each sharded dim (even shards assumed). run_check also checks that the
  // local shapes and dtypes are consistent across the mesh and fails on every rank otherwise.
  // Differentiable: the gradient of the result flows back to `local` as its local shard.
  static at::Tensor from_local(const at::Tensor& local, const DeviceMesh& mesh, Placements placements,
                               bool run_check = false, std::optional<std::vector<int64_t>> shape = std::nullopt,
                               std::optional<std::vector<int64_t>> stride = std::nullopt);
};

// Runs `fn`, written for plain tensors, on the local shards (PyTorch's local_map): each DTensor input is
// first redistributed to its entry of `in_placements` (nullopt: as it is; plain inputs pass unchanged),
// `fn` gets the locals, and its result is taken as this rank's shard of a DTensor with `out_placements`
// on the first DTensor input's mesh (even shards assumed for the global shape, as from_local). All steps
// are differentiable.
at::Tensor local_map(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                     const std::vector<at::Tensor>& inputs, const std::vector<std::optional<Placements>>& in_placements,
                     Placements out_placements);

}  // namespace dtensor
