// What a custom autograd function that communicates in backward carries from its forward:
// - the comm scope (dtensor/mesh/comm_hooks.h): saved as its forward ran and restored while its backward
//   runs, so that the backward's collectives are accounted to the module whose forward created the node;
// - its process group: groups live in their World's cache for the World's lifetime, so the graph keeps a
//   plain pointer.
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/process_group.h"

namespace dtensor::detail {

inline void save_comm_scope(torch::autograd::AutogradContext* ctx) { ctx->saved_data["comm_scope"] = current_comm_scope(); }

inline CommScopeGuard restore_comm_scope(torch::autograd::AutogradContext* ctx) {
  return CommScopeGuard(ctx->saved_data["comm_scope"].toStringRef());
}

inline void save_group(torch::autograd::AutogradContext* ctx, ProcessGroup& g) {
  ctx->saved_data["group"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(&g));
}

inline ProcessGroup& load_group(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<ProcessGroup*>(static_cast<intptr_t>(ctx->saved_data["group"].toInt()));
}

}  // namespace dtensor::detail
