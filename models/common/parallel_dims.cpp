#include "common/parallel_dims.h"

#include "dtensor/core/error.h"

namespace models {

std::string to_string(DataParallel kind) { return kind == DataParallel::fsdp ? "fsdp" : "ddp"; }

DataParallel data_parallel_from_string(const std::string& name) {
  if (name == "ddp") return DataParallel::ddp;
  if (name == "fsdp") return DataParallel::fsdp;
  throw DTENSOR_ERROR("dtensor: data parallel kind '", name, "' is not ddp or fsdp");
}

const dtensor::DeviceMesh& ParallelDims::build_mesh() {
  DTENSOR_CHECK(dp >= 1 && tp >= 1, "dtensor: ParallelDims: dp ", dp, " and tp ", tp, " must be >= 1");
  if (dp == 1) {
    mesh_ = dtensor::init_device_mesh(device, {tp}, {"tp"});
  } else {
    mesh_ = dtensor::init_device_mesh(device, {dp, tp}, {"dp", "tp"});
  }
  return *mesh_;
}

const dtensor::DeviceMesh& ParallelDims::world_mesh() const {
  DTENSOR_CHECK(mesh_, "dtensor: ParallelDims has no mesh: call build_mesh() (or from_mesh) first");
  return *mesh_;
}

dtensor::DeviceMesh ParallelDims::tp_mesh() const {
  const dtensor::DeviceMesh& mesh = world_mesh();
  return mesh.ndim() == 1 ? mesh : mesh["tp"];
}

ParallelDims ParallelDims::from_mesh(const dtensor::DeviceMesh& mesh, DataParallel data_parallel) {
  DTENSOR_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2,
                "dtensor: ParallelDims takes a 1-D (\"tp\") or 2-D (\"dp\", \"tp\") mesh, got ", mesh.ndim(),
                " dims");
  ParallelDims dims;
  dims.dp = mesh.ndim() == 1 ? 1 : mesh.size("dp");
  dims.tp = mesh.ndim() == 1 ? mesh.size() : mesh.size("tp");
  dims.data_parallel = data_parallel;
  dims.device = mesh.device_type();
  dims.mesh_ = mesh;
  return dims;
}

}  // namespace models
