// DTensor: a distributed tensor that is a real at::Tensor (PyTorch's torch.distributed.tensor.DTensor): the
// type. A DTensor's sizes() are the global shape; it holds this rank's local shard and its DTensorSpec. It runs
// through autograd, can be an nn parameter (requires_grad, .grad accumulating as a DTensor with the
// parameter's placements, detach, .data, zero_grad). Ops reach it through a dispatch key of its own (ops/).
//
// Making and moving DTensors (distribute_tensor, from_local, to_local, redistribute, full_tensor, local_map) is
// the API level above redistribute: dtensor/api/dtensor_api.h (PyTorch's _api.py).
#pragma once

#include <ATen/core/Tensor.h>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tensor/dtensor_spec.h"
#include "dtensor/tensor/placement.h"
#include "dtensor/tensor/shard_layout.h"

namespace dtensor {

bool is_dtensor(const at::Tensor& tensor);
const DTensorSpec& dtensor_spec(const at::Tensor& dtensor);  // throws if not a DTensor
inline const Placements& placements(const at::Tensor& dt) { return dtensor_spec(dt).placements; }
inline const DeviceMesh& device_mesh(const at::Tensor& dt) { return dtensor_spec(dt).mesh; }

namespace detail {
// A new DTensor around `local` (no autograd edge, no checks beyond shape consistency with the spec).
at::Tensor make_dtensor(at::Tensor local, DTensorSpec spec, bool requires_grad = false);
const at::Tensor& local_tensor(const at::Tensor& dtensor);  // the wrapped shard, no autograd
}  // namespace detail

}  // namespace dtensor
