// A c10d::Backend for CUDA tensors over a group's CPU backend: each collective copies its tensors to the
// host, runs there (shared memory or Gloo), waits, and copies the result back into the CUDA tensors.
//
// It is what DTENSOR_CUDA_BACKEND=gloo (InitOptions::cuda_backend = "gloo") gives CUDA tensors, PyTorch's
// "cuda:gloo": for ranks without NCCL between them, such as several processes sharing one GPU (NCCL refuses
// two ranks on one device). Every call synchronises with the device (the copies are blocking); NCCL is the
// fast path.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>

namespace dtensor::detail {

constexpr const char* kHostStagedBackendName = "dtensor_host_staged";

class HostStagedBackend : public c10d::Backend {
 public:
  HostStagedBackend(c10::intrusive_ptr<c10d::Backend> host, std::chrono::milliseconds timeout);

  const std::string getBackendName() const override { return kHostStagedBackendName; }

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

 private:
  // Waits for the host collective (bounded by the timeout); throws when it fails or does not finish.
  void finish(const c10::intrusive_ptr<c10d::Work>& work) const;

  c10::intrusive_ptr<c10d::Backend> host_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dtensor::detail
