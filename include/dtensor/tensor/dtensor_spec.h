// DTensorSpec: what a DTensor is beyond its local shard: the mesh, one placement per mesh dim, and the
// global shape, stride and dtype (PyTorch's _dtensor_spec.py).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tensor/placement.h"

namespace dtensor {

struct TensorMeta {
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  c10::ScalarType dtype = c10::ScalarType::Float;
  bool operator==(const TensorMeta& o) const { return shape == o.shape && stride == o.stride && dtype == o.dtype; }
};

// Contiguous (row-major) strides of `shape`.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

struct DTensorSpec {
  DeviceMesh mesh;
  Placements placements;  // one per mesh dim, Shard dims normalized
  TensorMeta meta;

  // Validates and normalizes: placements.size() == mesh.ndim(), Shard dims in range of the tensor rank.
  // Throws dtensor::Error naming the problem.
  DTensorSpec(DeviceMesh mesh, Placements placements, TensorMeta meta);

  int64_t ndim() const { return static_cast<int64_t>(meta.shape.size()); }
  bool has_partial() const;
  bool is_replicated() const;  // all Replicate
  std::string to_string() const;  // "Spec([Shard(dim=0)] on DeviceMesh(...), shape [4, 3], Float)"
  bool operator==(const DTensorSpec& o) const {
    return placements == o.placements && meta == o.meta && mesh == o.mesh;
  }
  bool operator!=(const DTensorSpec& o) const { return !(*this == o); }
};

// Where shards lie (chunk sizes, offsets, local_shard): dtensor/tensor/shard_layout.h.

}  // namespace dtensor
