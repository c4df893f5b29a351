#include "common/parallel_dims.h"

#include "dtensor/core/error.h"

namespace models {

std::string to_string(DataParallel kind) { return kind == DataParallel::fsdp ? "fsdp" : "ddp"; }

DataParallel data_parallel_from_string(const std::string& name) {
  if (name == "ddp") return DataParallel::ddp;
  if (name == "fsdp") return DataParallel::fsdp;
  throw DTENSOR_ERROR("dtensor: data parallel kind '", name, "' is not ddp or fsdp");
}

void ParallelDims::check() const {
  DTENSOR_CHECK(dp >= 1 && tp >= 1 && ep >= 1 && pp >= 1, "dtensor: ParallelDims: dp ", dp, ", tp ", tp, ", ep ", ep,
                " and pp ", pp, " must be >= 1");
  DTENSOR_CHECK(dp % ep == 0, "dtensor: ParallelDims: ep ", ep, " does not divide dp ", dp,
                " (expert parallelism borrows data-parallel ranks)");
  DTENSOR_CHECK(cp >= 1 && (cp == 1 || ep == 1), "dtensor: ParallelDims: cp ", cp, " with ep ", ep,
                ": context parallelism beside expert parallelism is not supported");
}

std::vector<int64_t> ParallelDims::mesh_shape() const {
  check();
  if (ep > 1) return {dp / ep, ep, tp};
  if (dp * cp > 1) return {dp * cp, tp};
  return {tp};
}

std::vector<std::string> ParallelDims::mesh_dim_names() const {
  check();
  if (ep > 1) return {"dp", "ep", "tp"};
  if (dp * cp > 1) return {"dp", "tp"};
  return {"tp"};
}

const dtensor::DeviceMesh& ParallelDims::build_mesh() {
  if (pp > 1) {
    std::vector<int64_t> shape = mesh_shape();
    std::vector<std::string> names = mesh_dim_names();
    shape.insert(shape.begin(), pp);
    names.insert(names.begin(), "pp");
    global_mesh_ = dtensor::init_device_mesh(device, shape, names);
    pp_mesh_ = (*global_mesh_)["pp"];
    names.erase(names.begin());
    mesh_ = names.size() == 1 ? (*global_mesh_)[names[0]] : global_mesh_->slice(names);
  } else {
    mesh_ = dtensor::init_device_mesh(device, mesh_shape(), mesh_dim_names());
  }
  // this rank's cp group, from the same ranks
  if (cp > 1) cp_mesh_ = mesh_->unflatten(0, {dp, cp}, {"dp", "cp"})["cp"];
  return *mesh_;
}

const dtensor::DeviceMesh& ParallelDims::world_mesh() const {
  DTENSOR_CHECK(mesh_, "dtensor: ParallelDims has no mesh: call build_mesh() (or from_mesh) first");
  return *mesh_;
}

dtensor::DeviceMesh ParallelDims::pp_mesh() const {
  DTENSOR_CHECK(pp > 1 && pp_mesh_, "dtensor: ParallelDims: no pipeline parallelism (pp 1, or no mesh built)");
  return *pp_mesh_;
}

int64_t ParallelDims::pp_rank() const { return pp > 1 ? pp_mesh().get_local_rank(0) : 0; }

const dtensor::DeviceMesh& ParallelDims::global_mesh() const { return global_mesh_ ? *global_mesh_ : world_mesh(); }

dtensor::DeviceMesh ParallelDims::tp_mesh() const {
  const dtensor::DeviceMesh& mesh = world_mesh();
  return mesh.ndim() == 1 ? mesh : mesh["tp"];
}

dtensor::DeviceMesh ParallelDims::data_mesh() const {
  DTENSOR_CHECK(dp_enabled(), "dtensor: ParallelDims: no data parallelism (dp 1, cp 1)");
  const dtensor::DeviceMesh& mesh = world_mesh();
  if (ep == 1) return mesh["dp"];
  return dp == ep ? mesh["ep"] : mesh.slice({"dp", "ep"}).flatten("dp_ep");
}

int64_t ParallelDims::data_rank() const {
  if (dp == 1) return 0;
  const dtensor::DeviceMesh& mesh = world_mesh();
  if (ep == 1) return mesh.get_local_rank("dp") / cp;  // the cp ranks of a group take the same rows
  return mesh.get_local_rank("dp") * ep + mesh.get_local_rank("ep");
}

dtensor::DeviceMesh ParallelDims::cp_mesh() const {
  DTENSOR_CHECK(cp > 1 && cp_mesh_, "dtensor: ParallelDims: no context parallelism (cp 1, or no mesh built)");
  return *cp_mesh_;
}

dtensor::DeviceMesh ParallelDims::expert_mesh() const {
  DTENSOR_CHECK(ep > 1, "dtensor: ParallelDims: no expert parallelism (ep 1)");
  const dtensor::DeviceMesh& mesh = world_mesh();
  return tp > 1 ? mesh.slice({"ep", "tp"}) : mesh["ep"];
}

ParallelDims ParallelDims::from_mesh(const dtensor::DeviceMesh& mesh, DataParallel data_parallel, int64_t cp) {
  const bool expert = mesh.ndim() == 3 && mesh.mesh_dim_names() == std::vector<std::string>{"dp", "ep", "tp"};
  DTENSOR_CHECK(mesh.ndim() == 1 || mesh.ndim() == 2 || expert,
                "dtensor: ParallelDims takes a 1-D (\"tp\"), 2-D (\"dp\", \"tp\") or 3-D (\"dp\", \"ep\", \"tp\") mesh, got ",
                mesh.to_string());
  ParallelDims dims;
  dims.dp = mesh.ndim() == 1 ? 1 : expert ? mesh.size("dp") * mesh.size("ep") : mesh.size("dp");
  dims.ep = expert ? mesh.size("ep") : 1;
  dims.tp = mesh.ndim() == 1 ? mesh.size() : mesh.size("tp");
  dims.data_parallel = data_parallel;
  dims.device = mesh.device_type();
  dims.mesh_ = mesh;
  if (cp > 1) {
    DTENSOR_CHECK(mesh.ndim() == 2 && !expert && dims.dp % cp == 0, "dtensor: ParallelDims: cp ", cp,
                  " needs a (\"dp\", \"tp\") mesh whose dp dim it divides, got ", mesh.to_string());
    dims.cp = cp;
    dims.dp /= cp;
    dims.cp_mesh_ = mesh.unflatten(0, {dims.dp, cp}, {"dp", "cp"})["cp"];
  }
  return dims;
}

}  // namespace models
