#include "dtensor/mesh/reduce_op.h"
#include "dtensor/core/error.h"

#include <stdexcept>

namespace dtensor {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return "sum";
    case ReduceOp::AVG: return "avg";
    case ReduceOp::MAX: return "max";
    case ReduceOp::MIN: return "min";
  }
  return "?";
}

ReduceOp reduce_op_from_name(const std::string& name) {
  if (name == "sum") return ReduceOp::SUM;
  if (name == "avg") return ReduceOp::AVG;
  if (name == "max") return ReduceOp::MAX;
  if (name == "min") return ReduceOp::MIN;
  throw DTENSOR_ERROR("dtensor: unknown reduce op '", name, "' (expected sum, avg, max or min)");
}

}  // namespace dtensor
