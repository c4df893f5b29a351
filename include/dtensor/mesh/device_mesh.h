// DeviceMesh: an N-D arrangement of global ranks with optional dim names, and one process group per mesh
// dim for this rank's slice along that dim (PyTorch's torch.distributed.device_mesh).
//
//   auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});   // world 4: [[0, 1], [2, 3]]
//   mesh["tp"]            // 1-D: rank 2 sees [2, 3]
//   mesh.get_group("dp")  // rank 2's dp group: ranks [0, 2]
//
// Construction is collective: every rank of the world builds the same mesh, in the same order relative to
// its other meshes (each builds the process groups of its own slices).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/mesh/process_group.h"

namespace dtensor {

class DeviceMesh {
 public:
  // `ranks` is the row-major layout of global ranks with the given shape (product(shape) == ranks.size()).
  DeviceMesh(std::string device_type, std::vector<int64_t> shape, std::vector<int> ranks,
             std::vector<std::string> dim_names = {}, std::shared_ptr<World> world = nullptr);

  // "cpu" or "cuda". A "cuda" mesh makes cuda:(LOCAL_RANK % GPUs visible) current, as PyTorch's does; its
  // DTensors hold their local tensors there, and its groups take CUDA tensors through NCCL (InitOptions).
  const std::string& device_type() const;
  c10::Device device() const;  // this process's device: cpu, or the cuda device chosen at construction
  int64_t ndim() const;
  const std::vector<int64_t>& shape() const;
  int64_t size() const;                       // number of ranks in the mesh
  int64_t size(int64_t mesh_dim) const;
  int64_t size(const std::string& dim_name) const { return size(dim_index(dim_name)); }
  const std::vector<std::string>& mesh_dim_names() const;  // empty when unnamed
  const std::vector<int>& ranks() const;      // row-major layout
  int get_rank() const;                       // this process's global rank

  // This rank's coordinate in the mesh; nullopt when it is not a member.
  std::optional<std::vector<int64_t>> get_coordinate() const;
  // This rank's index along `mesh_dim` (== its rank in get_group(mesh_dim)).
  int get_local_rank(int64_t mesh_dim) const;
  int get_local_rank(const std::string& dim_name) const { return get_local_rank(dim_index(dim_name)); }

  ProcessGroup& get_group(int64_t mesh_dim) const;
  ProcessGroup& get_group(const std::string& dim_name) const { return get_group(dim_index(dim_name)); }

  // The sub-mesh over the named dims (in mesh order) through this rank: other dims fixed at this rank's
  // coordinate. Reuses the parent's process groups; no communication.
  DeviceMesh operator[](const std::string& dim_name) const { return slice({dim_name}); }
  DeviceMesh slice(const std::vector<std::string>& dim_names) const;
  // The 1-D sub-mesh along mesh dim `mesh_dim` (negative counts from the end) through this rank, for meshes
  // with or without names (PyTorch's old tp_mesh_dim): the other dims fixed at this rank's coordinate.
  DeviceMesh submesh(int64_t mesh_dim) const;
  // This rank's slice over all dims as a 1-D mesh (collective over the slice's ranks if no group of
  // exactly those ranks exists yet).
  DeviceMesh flatten(const std::string& name = "") const;
  // The same ranks with mesh dim `mesh_dim` split into dims of `sizes` (their product its size) named `names`
  // (PyTorch's DeviceMesh._unflatten): ("dp", "tp") of (4, 2) -> ("dp", "cp", "tp") of (2, 2, 2). Collective over
  // the new dims' slices whose groups do not exist yet.
  DeviceMesh unflatten(int64_t mesh_dim, const std::vector<int64_t>& sizes, const std::vector<std::string>& names) const;

  int64_t dim_index(const std::string& dim_name) const;  // throws naming the known dims
  std::string to_string() const;  // DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))
  bool operator==(const DeviceMesh& other) const;
  const void* id() const { return impl_.get(); }  // identity of this live mesh object (groups within one call)
  // Unique for the process's lifetime, never shared with a mesh that is gone (unlike id(), an address a later mesh
  // may take): what caches that outlive a mesh key by (the op decision cache).
  uint64_t serial() const;
  bool operator!=(const DeviceMesh& other) const { return !(*this == other); }

 private:
  struct Impl;
  explicit DeviceMesh(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  DeviceMesh slice_dims(const std::vector<int64_t>& dims, const std::vector<std::string>& dim_names) const;
  std::shared_ptr<const Impl> impl_;
};

// A mesh over all ranks of the current world, laid out row-major (rank r at coordinate unravel(r)).
DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int64_t> mesh_shape,
                            std::vector<std::string> mesh_dim_names = {});

}  // namespace dtensor
