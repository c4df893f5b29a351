#include "dtensor/mesh/device_mesh.h"

#include <atomic>
#include "dtensor/core/error.h"
#include "dtensor/mesh/cuda.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>
#include <stdexcept>

namespace dtensor {

struct DeviceMesh::Impl {
  uint64_t serial = next_serial();  // never reused (DeviceMesh::serial)
  static uint64_t next_serial() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }
  std::string device_type;
  c10::Device device{c10::kCPU};  // this process's device of that type
  std::vector<int64_t> shape;
  std::vector<int> ranks;  // row-major
  std::vector<std::string> names;
  std::shared_ptr<World> world;
  std::optional<std::vector<int64_t>> coordinate;      // this rank's, if a member
  std::vector<std::shared_ptr<ProcessGroup>> groups;   // per mesh dim; empty when not a member
};

namespace {

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

// Global ranks along `dim` through `coord` (the other coordinates fixed).
std::vector<int> ranks_along(const DeviceMesh& m, const std::vector<int64_t>& coord, int64_t dim) {
  auto strides = strides_of(m.shape());
  int64_t base = 0;
  for (size_t d = 0; d < coord.size(); ++d) {
    if (static_cast<int64_t>(d) != dim) base += coord[d] * strides[d];
  }
  std::vector<int> out;
  for (int64_t i = 0; i < m.shape()[dim]; ++i) out.push_back(m.ranks()[base + i * strides[dim]]);
  return out;
}

std::string quoted_names(const std::vector<std::string>& names) {
  std::string s = "(";
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", '" : "'") + names[i] + "'";
  return s + (names.size() == 1 ? ",)" : ")");
}

}  // namespace

DeviceMesh::DeviceMesh(std::string device_type, std::vector<int64_t> shape, std::vector<int> ranks,
                       std::vector<std::string> dim_names, std::shared_ptr<World> world) {
  auto impl = std::make_shared<Impl>();
  if (device_type == "cuda") {
    // As PyTorch's init_device_mesh: this process works on cuda:LOCAL_RANK (modulo the GPUs it sees).
    DTENSOR_CHECK(cuda_available(), "dtensor: DeviceMesh device_type 'cuda': ", cuda_unavailable_reason());
    impl->device = select_cuda_device();
  } else if (device_type != "cpu") {
    throw DTENSOR_ERROR("dtensor: DeviceMesh device_type '", device_type, "' is not supported (\"cpu\" or \"cuda\")");
  }
  if (!world) world = current_world();
  DTENSOR_CHECK(!shape.empty(), "dtensor: DeviceMesh needs at least one dim");
  int64_t n = 1;
  for (int64_t s : shape) {
    DTENSOR_CHECK(s >= 1, "dtensor: DeviceMesh dims must be >= 1");
    n *= s;
  }
  DTENSOR_CHECK(n == static_cast<int64_t>(ranks.size()), "dtensor: DeviceMesh shape holds ", n, " ranks but ",
                ranks.size(), " were given");
  std::set<int> unique(ranks.begin(), ranks.end());
  DTENSOR_CHECK(unique.size() == ranks.size() && *unique.begin() >= 0 && *unique.rbegin() < world->size(),
                "dtensor: DeviceMesh ranks must be distinct and within the world of ", world->size());
  if (!dim_names.empty()) {
    DTENSOR_CHECK(dim_names.size() == shape.size(), "dtensor: DeviceMesh has ", shape.size(), " dims but ",
                  dim_names.size(), " names");
    std::set<std::string> unique_names(dim_names.begin(), dim_names.end());
    DTENSOR_CHECK(unique_names.size() == dim_names.size(), "dtensor: DeviceMesh dim names must be unique, got ",
                  quoted_names(dim_names));
  }
  impl->device_type = std::move(device_type);
  impl->shape = std::move(shape);
  impl->ranks = std::move(ranks);
  impl->names = std::move(dim_names);
  impl->world = std::move(world);
  impl_ = impl;

  auto pos = std::find(impl->ranks.begin(), impl->ranks.end(), impl->world->rank());
  if (pos == impl->ranks.end()) return;  // not a member: no coordinate, no groups
  int64_t flat = pos - impl->ranks.begin();
  auto strides = strides_of(impl->shape);
  std::vector<int64_t> coord(impl->shape.size());
  for (size_t d = 0; d < coord.size(); ++d) coord[d] = (flat / strides[d]) % impl->shape[d];
  impl->coordinate = coord;
  // One group per mesh dim, created in dim order on every rank (group creation is collective).
  for (int64_t d = 0; d < ndim(); ++d) impl->groups.push_back(impl->world->group(ranks_along(*this, coord, d)));
}

const std::string& DeviceMesh::device_type() const { return impl_->device_type; }
c10::Device DeviceMesh::device() const { return impl_->device; }
int64_t DeviceMesh::ndim() const { return static_cast<int64_t>(impl_->shape.size()); }
const std::vector<int64_t>& DeviceMesh::shape() const { return impl_->shape; }
int64_t DeviceMesh::size() const { return static_cast<int64_t>(impl_->ranks.size()); }
const std::vector<std::string>& DeviceMesh::mesh_dim_names() const { return impl_->names; }
const std::vector<int>& DeviceMesh::ranks() const { return impl_->ranks; }
int DeviceMesh::get_rank() const { return impl_->world->rank(); }
std::optional<std::vector<int64_t>> DeviceMesh::get_coordinate() const { return impl_->coordinate; }

int64_t DeviceMesh::size(int64_t mesh_dim) const {
  if (mesh_dim < 0) mesh_dim += ndim();
  DTENSOR_CHECK(mesh_dim >= 0 && mesh_dim < ndim(), "dtensor: mesh dim ", mesh_dim, " is out of range for a ", ndim(),
                "-D mesh");
  return impl_->shape[mesh_dim];
}

int64_t DeviceMesh::dim_index(const std::string& dim_name) const {
  auto it = std::find(impl_->names.begin(), impl_->names.end(), dim_name);
  DTENSOR_CHECK(it != impl_->names.end(), "dtensor: mesh dim '", dim_name, "' not found; the mesh's dims are ",
                (impl_->names.empty() ? std::string("unnamed") : quoted_names(impl_->names)));
  return it - impl_->names.begin();
}

int DeviceMesh::get_local_rank(int64_t mesh_dim) const { return get_group(mesh_dim).rank(); }

ProcessGroup& DeviceMesh::get_group(int64_t mesh_dim) const {
  size(mesh_dim);  // range check
  if (mesh_dim < 0) mesh_dim += ndim();
  DTENSOR_CHECK(impl_->coordinate, "dtensor: rank ", get_rank(), " is not in ", to_string());
  return *impl_->groups[mesh_dim];
}

DeviceMesh DeviceMesh::slice(const std::vector<std::string>& dim_names) const {
  std::vector<int64_t> dims;
  for (const auto& name : dim_names) dims.push_back(dim_index(name));
  DTENSOR_CHECK(!dims.empty() && std::is_sorted(dims.begin(), dims.end()) &&
                    std::adjacent_find(dims.begin(), dims.end()) == dims.end(),
                "dtensor: slice dims ", quoted_names(dim_names), " must be distinct and in the mesh's order ",
                quoted_names(impl_->names));
  return slice_dims(dims, dim_names);
}

DeviceMesh DeviceMesh::submesh(int64_t mesh_dim) const {
  DTENSOR_CHECK(mesh_dim >= -ndim() && mesh_dim < ndim(), "dtensor: mesh dim ", mesh_dim, " is out of range for ",
                to_string(), " (", ndim(), " dims)");
  if (mesh_dim < 0) mesh_dim += ndim();
  std::vector<std::string> names;
  if (!impl_->names.empty()) names.push_back(impl_->names[mesh_dim]);
  return slice_dims({mesh_dim}, names);
}

DeviceMesh DeviceMesh::slice_dims(const std::vector<int64_t>& dims, const std::vector<std::string>& dim_names) const {
  DTENSOR_CHECK(impl_->coordinate, "dtensor: rank ", get_rank(), " cannot slice ", to_string(), ": it is not a member");
  auto sub = std::make_shared<Impl>();
  sub->device_type = impl_->device_type;
  sub->device = impl_->device;
  sub->world = impl_->world;
  sub->names = dim_names;
  const auto& own = *impl_->coordinate;
  auto strides = strides_of(impl_->shape);
  std::vector<int64_t> sub_shape, sub_coord;
  for (int64_t d : dims) {
    sub_shape.push_back(impl_->shape[d]);
    sub_coord.push_back(own[d]);
    sub->groups.push_back(impl_->groups[d]);
  }
  // Enumerate the sub-mesh row-major: vary the selected dims, keep the others at this rank's coordinate.
  int64_t count = 1;
  for (int64_t s : sub_shape) count *= s;
  auto sub_strides = strides_of(sub_shape);
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> coord = own;
    for (size_t k = 0; k < dims.size(); ++k) coord[dims[k]] = (i / sub_strides[k]) % sub_shape[k];
    int64_t flat = 0;
    for (size_t d = 0; d < coord.size(); ++d) flat += coord[d] * strides[d];
    sub->ranks.push_back(impl_->ranks[flat]);
  }
  sub->shape = std::move(sub_shape);
  sub->coordinate = std::move(sub_coord);
  return DeviceMesh(std::move(sub));
}

DeviceMesh DeviceMesh::flatten(const std::string& name) const {
  std::string flat_name = name;
  if (flat_name.empty() && !impl_->names.empty()) {
    for (size_t i = 0; i < impl_->names.size(); ++i) flat_name += (i ? "_" : "") + impl_->names[i];
  }
  std::vector<std::string> names;
  if (!flat_name.empty()) names.push_back(flat_name);
  return DeviceMesh(impl_->device_type, {size()}, impl_->ranks, names, impl_->world);
}

DeviceMesh DeviceMesh::unflatten(int64_t mesh_dim, const std::vector<int64_t>& sizes,
                                  const std::vector<std::string>& names) const {
  const int64_t d = mesh_dim < 0 ? mesh_dim + ndim() : mesh_dim;
  DTENSOR_CHECK(d >= 0 && d < ndim(), "dtensor: unflatten: mesh dim ", mesh_dim, " of a ", ndim(), "-D mesh");
  int64_t product = 1;
  for (int64_t s : sizes) product *= s;
  DTENSOR_CHECK(product == impl_->shape[static_cast<size_t>(d)] && names.size() == sizes.size(),
                "dtensor: unflatten: sizes multiplying to ", impl_->shape[static_cast<size_t>(d)], " with a name each");
  std::vector<int64_t> shape;
  std::vector<std::string> dim_names;
  for (int64_t i = 0; i < ndim(); ++i) {
    if (i == d) {
      shape.insert(shape.end(), sizes.begin(), sizes.end());
      dim_names.insert(dim_names.end(), names.begin(), names.end());
    } else {
      shape.push_back(impl_->shape[static_cast<size_t>(i)]);
      if (!impl_->names.empty()) dim_names.push_back(impl_->names[static_cast<size_t>(i)]);
    }
  }
  DTENSOR_CHECK(impl_->names.empty() || dim_names.size() == shape.size(), "dtensor: unflatten: names");
  if (impl_->names.empty()) dim_names.clear();
  return DeviceMesh(impl_->device_type, shape, impl_->ranks, dim_names, impl_->world);
}

std::string DeviceMesh::to_string() const {
  std::ostringstream os;
  os << "DeviceMesh('" << impl_->device_type << "', ";
  auto strides = strides_of(impl_->shape);
  std::function<void(size_t, int64_t)> emit = [&](size_t dim, int64_t base) {
    os << "[";
    for (int64_t i = 0; i < impl_->shape[dim]; ++i) {
      if (i) os << ", ";
      if (dim + 1 == impl_->shape.size()) os << impl_->ranks[base + i];
      else emit(dim + 1, base + i * strides[dim]);
    }
    os << "]";
  };
  emit(0, 0);
  if (!impl_->names.empty()) os << ", mesh_dim_names=" << quoted_names(impl_->names);
  os << ")";
  return os.str();
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  return impl_ == other.impl_ || (impl_->device_type == other.impl_->device_type && impl_->shape == other.impl_->shape &&
                                  impl_->ranks == other.impl_->ranks && impl_->names == other.impl_->names);
}

DeviceMesh init_device_mesh(const std::string& device_type, std::vector<int64_t> mesh_shape,
                            std::vector<std::string> mesh_dim_names) {
  auto world = current_world();
  int64_t n = 1;
  for (int64_t s : mesh_shape) n *= s;
  DTENSOR_CHECK(n == world->size(), "dtensor: init_device_mesh shape holds ", n, " ranks but the world has ",
                world->size());
  std::vector<int> ranks(world->size());
  std::iota(ranks.begin(), ranks.end(), 0);
  return DeviceMesh(device_type, std::move(mesh_shape), std::move(ranks), std::move(mesh_dim_names), world);
}

uint64_t DeviceMesh::serial() const { return impl_->serial; }

}  // namespace dtensor
