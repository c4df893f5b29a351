// The comm scope (dtensor/mesh/comm_hooks.h) across autograd: a custom autograd function that communicates
// in backward saves the scope its forward ran under and restores it while its backward runs, so that the
// backward's collectives are accounted to the module whose forward created the node.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include "dtensor/mesh/comm_hooks.h"

namespace dtensor::detail {

inline void save_comm_scope(torch::autograd::AutogradContext* ctx) { ctx->saved_data["comm_scope"] = current_comm_scope(); }

inline CommScopeGuard restore_comm_scope(torch::autograd::AutogradContext* ctx) {
  return CommScopeGuard(ctx->saved_data["comm_scope"].toStringRef());
}

}  // namespace dtensor::detail
