#include "dtensor/tensor/dtensor_spec.h"
#include "dtensor/core/error.h"

#include <sstream>
#include <stdexcept>


namespace dtensor {

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * std::max<int64_t>(shape[d + 1], 1);
  }
  return strides;
}

DTensorSpec::DTensorSpec(DeviceMesh mesh_, Placements placements_, TensorMeta meta_)
    : mesh(std::move(mesh_)), placements(std::move(placements_)), meta(std::move(meta_)) {
  DTENSOR_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), "dtensor: ", placements.size(), " placements ",
                dtensor::to_string(placements), " for a ", mesh.ndim(), "-D mesh; give one placement per mesh dim");
  for (auto& p : placements) p = p.normalized(ndim());
  for (const auto& p : placements) {
    for (const auto& q : placements) {
      // sum and avg mix (both linear: avg is a scaled sum); with max or min the order of reductions matters.
      auto linear = [](const Placement& x) { return x.reduce_op() == ReduceOp::SUM || x.reduce_op() == ReduceOp::AVG; };
      DTENSOR_CHECK(!p.is_partial() || !q.is_partial() || p.reduce_op() == q.reduce_op() || (linear(p) && linear(q)),
                    "dtensor: mixed Partial reduce ops in ", dtensor::to_string(placements),
                    " are not supported (the order of the reductions would matter)");
    }
  }
  if (meta.stride.empty() && !meta.shape.empty()) meta.stride = contiguous_strides(meta.shape);
}

bool DTensorSpec::has_partial() const {
  for (const auto& p : placements) {
    if (p.is_partial()) return true;
  }
  return false;
}

bool DTensorSpec::is_replicated() const {
  for (const auto& p : placements) {
    if (!p.is_replicate()) return false;
  }
  return true;
}

std::string DTensorSpec::to_string() const {
  std::ostringstream os;
  os << "Spec(" << dtensor::to_string(placements) << " on " << mesh.to_string() << ", shape [";
  for (size_t i = 0; i < meta.shape.size(); ++i) os << (i ? ", " : "") << meta.shape[i];
  os << "], " << c10::toString(meta.dtype) << ")";
  return os.str();
}

}  // namespace dtensor
