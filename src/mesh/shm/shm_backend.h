// A c10d::Backend for CPU tensors of ranks that share a host: collectives through shared memory
// (shm_comm.h), with a Gloo backend of the same group kept for whatever the fast path does not cover.
//
// Covered: all_reduce (SUM, MAX, MIN; the process group makes AVG from SUM), all_gather into one tensor,
// reduce_scatter from one tensor, all_to_all_single, broadcast, barrier; contiguous CPU tensors of float32,
// float64, bfloat16, float16, int64. Anything else goes to Gloo, a choice each rank makes from the call's
// arguments alone; the ranks first meet through shared memory with their size descriptors, so ranks that
// disagree (one covered, one not) fail with the mismatch error instead of hanging.
//
// Blocking calls (c10d's asyncOp false, as our ProcessGroup's blocking forms pass) run inline and return a
// completed Work, failures thrown at issue; asynchronous calls go to the group's FIFO worker and the Work
// completes later, its wait() rethrowing the failure (issue_queue.h has the choice and the ordering rule).
// Failures are dtensor::Error naming the collective, the group and the peer.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <memory>

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "mesh/shm/issue_queue.h"
#include "mesh/shm/shm_comm.h"

namespace dtensor::detail::shm {

constexpr const char* kBackendName = "dtensor_shm";

class ShmBackend : public c10d::Backend {
 public:
  ShmBackend(std::unique_ptr<ShmComm> comm, c10::intrusive_ptr<c10d::Backend> fallback);

  const std::string getBackendName() const override { return kBackendName; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  c10d::Backend& fallback() { return *fallback_; }
  bool comm_broken() const { return comm_->broken(); }  // a collective failed on a peer: see ShmComm::broken

 private:
  // For a call the fast path does not carry: the size check in shared memory (after what is queued), then
  // the fallback's own collective.
  template <typename Issue>
  c10::intrusive_ptr<c10d::Work> to_fallback(const char* collective, const std::vector<int64_t>& descriptor,
                                             Issue&& issue);

  std::unique_ptr<ShmComm> comm_;
  c10::intrusive_ptr<c10d::Backend> fallback_;
  IssueQueue queue_;  // declared last: destroyed first, running what is queued while comm_ still exists
};

}  // namespace dtensor::detail::shm
