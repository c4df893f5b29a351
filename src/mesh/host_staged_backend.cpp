#include "mesh/host_staged_backend.h"

#include "dtensor/core/error.h"
#include "mesh/done_work.h"

namespace dtensor::detail {
namespace {

at::Tensor to_host(const at::Tensor& t) { return t.to(at::kCPU).contiguous(); }

}  // namespace

HostStagedBackend::HostStagedBackend(c10::intrusive_ptr<c10d::Backend> host, std::chrono::milliseconds timeout)
    : c10d::Backend(host->getRank(), host->getSize()), host_(std::move(host)), timeout_(timeout) {}

void HostStagedBackend::finish(const c10::intrusive_ptr<c10d::Work>& work) const {
  if (!work->wait(timeout_)) {
    throw DTENSOR_ERROR("dtensor: the host copy of a CUDA collective did not complete within ",
                        timeout_.count(), " ms");
  }
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  std::vector<at::Tensor> host;
  for (const auto& t : tensors) host.push_back(to_host(t));
  finish(host_->allreduce(host, opts));
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(host[i]);
  return done_work(c10d::OpType::ALLREDUCE);
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::_allgather_base(at::Tensor& out, at::Tensor& in,
                                                                  const c10d::AllgatherOptions& opts) {
  at::Tensor host_in = to_host(in);
  at::Tensor host_out = at::empty(out.sizes(), out.options().device(at::kCPU));
  finish(host_->_allgather_base(host_out, host_in, opts));
  out.copy_(host_out);
  return done_work(c10d::OpType::_ALLGATHER_BASE);
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                       const c10d::ReduceScatterOptions& opts) {
  at::Tensor host_in = to_host(in);
  at::Tensor host_out = at::empty(out.sizes(), out.options().device(at::kCPU));
  finish(host_->_reduce_scatter_base(host_out, host_in, opts));
  out.copy_(host_out);
  return done_work(c10d::OpType::_REDUCE_SCATTER_BASE);
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::alltoall_base(at::Tensor& out, at::Tensor& in,
                                                                std::vector<int64_t>& out_splits,
                                                                std::vector<int64_t>& in_splits,
                                                                const c10d::AllToAllOptions& opts) {
  at::Tensor host_in = to_host(in);
  at::Tensor host_out = at::empty(out.sizes(), out.options().device(at::kCPU));
  finish(host_->alltoall_base(host_out, host_in, out_splits, in_splits, opts));
  out.copy_(host_out);
  return done_work(c10d::OpType::ALLTOALL_BASE);
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  std::vector<at::Tensor> host;
  for (const auto& t : tensors) host.push_back(to_host(t));
  finish(host_->broadcast(host, opts));
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(host[i]);
  return done_work(c10d::OpType::BROADCAST);
}

c10::intrusive_ptr<c10d::Work> HostStagedBackend::barrier(const c10d::BarrierOptions& opts) {
  finish(host_->barrier(opts));
  return done_work(c10d::OpType::BARRIER);
}

}  // namespace dtensor::detail
