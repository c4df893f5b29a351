// ParallelDims (torchtitan's distributed/parallel_dims.py): the degree of each parallelism and the mesh they
// make, shared by every model family's parallelize_<family>(model, parallel_dims, config).
//
//   world = dp * cp * tp. At dp * cp 1 the mesh is 1-D ("tp"); else 2-D ("dp", "tp") with the TP ranks adjacent
//   (rank = dp_index * tp + tp_index): TP inside a host, data parallel across hosts.
//   Context parallelism (torchtitan's order dp, cp, tp): the cp ranks of a data-parallel group take the same rows
//   and split their sequence (dtensor/cp/context_parallel.h). They hold different tokens, so the mesh's "dp" dim
//   spans dp * cp ranks (rank = (dp_index * cp + cp_index) * tp + tp_index; FSDP shards over it, DDP averages over
//   it, as torchtitan's dp_shard_cp), and cp_mesh() is the 1-D mesh of this rank's cp group.
//   Expert parallelism borrows data-parallel ranks, as torchtitan's does: ep divides dp, and the mesh is 3-D
//   ("dp", "ep", "tp") of sizes (dp / ep, ep, tp) (dims of size 1 kept), the data rank being
//   dp_index * ep + ep_index. The ep ranks hold different tokens and split the experts between them; the
//   dense parameters are averaged over all dp ranks (data_mesh), the experts over "dp" only.
//   Pipeline parallelism (torchtitan's order pp, dp, cp, tp: pp outermost, across hosts) cuts the model into pp
//   stages: the whole mesh is ("pp", <the dims above>) (rank = pp_index * dp * cp * tp + ...). build_mesh keeps the
//   dims above of this rank's stage as the mesh every accessor reads (world_mesh() is the stage's mesh: the TP plan,
//   DDP and FSDP run inside a stage), pp_mesh() the 1-D mesh of this rank's pipeline, global_mesh() the whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/mesh/device_mesh.h"

namespace models {

// What runs over the "dp" mesh dim: replicate (DDP: whole parameters, gradients all-reduced) or fully_shard
// (FSDP2: parameters sharded, gathered per block).
enum class DataParallel { ddp, fsdp };
std::string to_string(DataParallel kind);
// "ddp" or "fsdp"; anything else throws dtensor::Error naming it.
DataParallel data_parallel_from_string(const std::string& name);

struct ParallelDims {
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t ep = 1;                                  // divides dp
  int64_t cp = 1;                                  // context parallel: the sequence split over cp ranks
  int64_t pp = 1;                                  // pipeline parallel: the layers cut into pp stages
  DataParallel data_parallel = DataParallel::ddp;  // with dp > 1
  std::string device = "cpu";                      // the mesh's device type

  bool dp_enabled() const { return dp * cp > 1; }  // ranks hold different tokens: gradients are averaged over them
  bool tp_enabled() const { return tp > 1; }
  bool ep_enabled() const { return ep > 1; }
  bool cp_enabled() const { return cp > 1; }
  bool pp_enabled() const { return pp > 1; }
  int64_t world_size() const { return pp * dp * cp * tp; }

  // The mesh-shape rule, in one place (build_mesh, the dry run's fake meshes): ("tp") when dp * cp is 1; ("dp", "tp")
  // of (dp * cp, tp); ("dp", "ep", "tp") of (dp / ep, ep, tp) when ep > 1. Throw dtensor::Error for degrees that do
  // not fit together (check).
  std::vector<int64_t> mesh_shape() const;
  std::vector<std::string> mesh_dim_names() const;
  void check() const;
  // Makes the mesh over the initialised world (its size must be pp * dp * cp * tp) and keeps it (with pp > 1: this
  // stage's part of it). The shapes above are a stage's: without the pp dim.
  const dtensor::DeviceMesh& build_mesh();
  // The 1-D ("pp") mesh of the ranks that hold this rank's coordinate in every stage, and this rank's stage in it.
  // Need pp > 1 and build_mesh.
  dtensor::DeviceMesh pp_mesh() const;
  int64_t pp_rank() const;
  // The whole world's mesh: ("pp", ...) with pp > 1, else world_mesh().
  const dtensor::DeviceMesh& global_mesh() const;
  // The mesh that build_mesh made or from_mesh took; throws when there is none.
  const dtensor::DeviceMesh& world_mesh() const;
  bool has_mesh() const { return mesh_.has_value(); }
  // The "tp" dim of the mesh (the mesh itself when 1-D).
  dtensor::DeviceMesh tp_mesh() const;
  // The 1-D mesh over the ranks through this rank that hold other tokens (dp * cp of them). Needs dp * cp > 1.
  dtensor::DeviceMesh data_mesh() const;
  // Which rows of the global batch this rank takes (its dp index, in [0, dp)).
  int64_t data_rank() const;
  // The 1-D mesh of this rank's cp group (the ranks that split one sequence). Needs cp > 1.
  dtensor::DeviceMesh cp_mesh() const;
  // Expert parallelism: the experts' mesh, ("ep") or ("ep", "tp") when tp > 1. Needs ep > 1.
  dtensor::DeviceMesh expert_mesh() const;

  // The dims of an existing mesh from build_mesh's layout (a dry run's fake mesh, a test's own mesh): 1-D
  // ("tp"), 2-D ("dp", "tp") or 3-D ("dp", "ep", "tp").
  // cp > 1: the mesh's "dp" dim holds dp * cp ranks, as build_mesh lays them out.
  static ParallelDims from_mesh(const dtensor::DeviceMesh& mesh, DataParallel data_parallel = DataParallel::ddp,
                                int64_t cp = 1);

 private:
  std::optional<dtensor::DeviceMesh> mesh_;
  std::optional<dtensor::DeviceMesh> cp_mesh_;
  std::optional<dtensor::DeviceMesh> pp_mesh_, global_mesh_;
};

}  // namespace models
