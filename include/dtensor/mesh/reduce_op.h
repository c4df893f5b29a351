#pragma once

#include <string>

namespace dtensor {

// Reductions a collective (and a Partial placement) can carry. Gloo has no AVG: it is SUM followed by a
// division by the group size.
enum class ReduceOp { SUM, AVG, MAX, MIN };

const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min" (PyTorch's spelling)
ReduceOp reduce_op_from_name(const std::string& name);  // throws on an unknown name

}  // namespace dtensor
