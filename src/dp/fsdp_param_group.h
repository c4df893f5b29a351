// One fully_shard call's parameters (include/dtensor/dp/fully_shard.h): their dp shards, the flat
// all-gather that rebuilds the TP-local parameters, and the flat reduce-scatter of their gradients.
//
// Flat layout over dp (FSDP2's copy-in / copy-out). Parameter p has R_p rows (dim 0 of its TP-local
// tensor) of e_p elements; dp rank i holds torch.chunk piece i (rows_p[i] rows), padded to c_p = ceil(R_p / dp)
// rows. One rank's flat shard is [p0's padded chunk | p1's padded chunk | ...] of S = sum c_p·e_p
// elements; the all-gather's output is dp such shards, rank-major, and p's TP-local tensor is the
// concatenation over i of rank i's piece of p. The reduce-scatter runs the same layout backwards.
//
// Prefetch (FullyShardOptions::prefetch). The groups under one root run forward in a fixed order, learnt in
// the first forward (FsdpSchedule). From then on, group k's forward pre-hook, once its own parameters are
// in, starts group k+1's all-gather asynchronously, and the hook that gathers group k again before its
// backward starts group k-1's: the next gather is in flight while this module computes. The all-gathers
// over dp are issued in the same order on every rank (the forward order, then its reverse), as collectives
// of one group must be; the next group's unshard() waits for its own.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/process_group.h"
#include "dtensor/dp/fully_shard.h"
#include "dtensor/tensor/dtensor_spec.h"

namespace dtensor::detail {

struct FsdpParam {
  std::vector<std::pair<torch::nn::Module*, std::string>> uses;  // (owner, name): tied weights have two
  at::Tensor sharded;                     // registered parameter: DTensor on the whole mesh, leaf
  std::optional<DTensorSpec> tp_spec;     // the TP DTensor's spec (nullopt: a plain parameter)
  std::vector<int64_t> local_shape;       // TP-local shape (gathered)
  std::vector<int64_t> rows;              // dp chunk sizes of dim 0
  int64_t row_numel = 1;                  // elements per row
  int64_t padded_rows = 0;                // c_p
  int64_t flat_offset = 0;                // in one rank's flat shard
  int64_t local_offset = 0;               // in the gathered storage
  at::Tensor gathered_local;              // TP-local data, aliasing the gathered storage (no autograd)
  at::Tensor unsharded;                   // what forward reads: leaf requiring grad (TP DTensor or plain)
  // Gradient accumulation with sync off, under mixed precision: the unsharded gradients of the earlier micro-batches
  // in reduce_dtype (FSDP2's unsharded accumulated grad), so that bf16 gradients add up in fp32. Undefined otherwise.
  at::Tensor accumulated;
};

class FsdpParamGroup;

// The groups of one root in forward order (the root first), recorded by the first forward.
struct FsdpSchedule {
  std::vector<std::weak_ptr<FsdpParamGroup>> forward_order;
  bool recorded = false;
  // The group `step` places after `group` in forward order (step -1: before it), or null.
  std::shared_ptr<FsdpParamGroup> neighbour(const FsdpParamGroup* group, int step) const;
};

class FsdpParamGroup : public std::enable_shared_from_this<FsdpParamGroup> {
 public:
  FsdpParamGroup(std::vector<FsdpParam> params, DeviceMesh mesh, DeviceMesh dp_mesh, bool is_root,
                 FullyShardOptions options);

  // Forward pre-hook: records the forward order (first forward), gathers, prefetches the next group.
  void on_forward_start();
  // Before this module's backward (a hook on its output's gradient): gathers, prefetches the previous group.
  void on_backward_start();
  // Gathers the parameters (if not gathered; waiting for a prefetch in flight) and points the layers'
  // forward at them.
  void unshard();
  // Starts the all-gather without waiting (a prefetch); unshard() finishes it. No-op when gathered or
  // already in flight.
  void start_unshard(bool async_op);
  // Frees the gathered storage and points the layers back at the shards.
  void reshard();
  void on_forward_end();   // reshard after forward (not the root)
  void on_gradient(size_t index);  // post-accumulate-grad of param `index`'s unsharded tensor
  // FSDP2's set_requires_gradient_sync: false keeps each backward's unsharded gradients (added up over the
  // micro-batches, in reduce_dtype) and reduce-scatters nothing; the next backward with true reduce-scatters the sum
  // once. The gathered parameters are freed after each backward either way.
  void set_requires_gradient_sync(bool requires_gradient_sync);
  bool is_root() const { return is_root_; }
  bool options_reshard_after_forward() const { return options_.reshard_after_forward; }
  void set_schedule(std::shared_ptr<FsdpSchedule> schedule) { schedule_ = std::move(schedule); }
  const std::vector<FsdpParam>& params() const { return params_; }

 private:
  void reduce_gradients();  // the flat reduce-scatter of every pending unsharded gradient
  void keep_gradients();    // sync off: the arrived gradients stay unsharded (into `accumulated` under mixed precision)
  void finish_gradients();  // reduce_gradients or keep_gradients, as the sync setting says
  void end_of_backward();
  void finish_unshard();  // waits for the all-gather in flight and copies out

  std::vector<FsdpParam> params_;
  DeviceMesh mesh_, dp_mesh_;
  int64_t dp_ = 1, dp_rank_ = 0;
  bool is_root_;
  FullyShardOptions options_;
  int64_t shard_numel_ = 0;   // S
  at::ScalarType compute_dtype_ = at::kFloat;  // of the gathered parameters (mp_policy.param_dtype)
  at::ScalarType reduce_dtype_ = at::kFloat;   // of the gradients' reduce-scatter (mp_policy.reduce_dtype)
  at::Tensor gathered_;        // flat TP-local storage of all params (freed when resharded)
  int64_t gathered_bytes_ = 0;
  bool is_unsharded_ = false;
  std::shared_ptr<FsdpSchedule> schedule_;  // set by the root's fully_shard; null until then
  // The all-gather in flight (declared after its buffers: destroyed first, it waits before they go).
  at::Tensor gather_in_, gather_out_;
  bool gather_started_ = false;
  Work gather_work_;
  std::mutex mu_;
  std::vector<bool> arrived_;
  size_t num_arrived_ = 0;
  bool callback_queued_ = false;
  bool requires_gradient_sync_ = true;
};

// set_requires_gradient_sync on the group that took `parameter` (a sharded parameter of a fully_shard call); false
// when no live group took it.
bool set_fsdp_requires_gradient_sync(const at::Tensor& parameter, bool requires_gradient_sync);

}  // namespace dtensor::detail
