#include "mesh/shm/shm_backend.h"

#include <numeric>

#include "dtensor/core/error.h"
#include "mesh/size_agreement.h"

namespace dtensor::detail::shm {
namespace {

bool covered(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == c10::kStrided && t.is_contiguous() && reducible(t.scalar_type());
}

bool reduction_of(const c10d::ReduceOp& op, Reduction* out) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: *out = Reduction::SUM; return true;
    case c10d::ReduceOp::MAX: *out = Reduction::MAX; return true;
    case c10d::ReduceOp::MIN: *out = Reduction::MIN; return true;
    default: return false;
  }
}

// c10d reads empty splits as equal rows to every rank.
std::vector<int64_t> splits_or_equal(const std::vector<int64_t>& splits, const at::Tensor& t, int n,
                                     const char* which) {
  const int64_t rows = t.dim() ? t.size(0) : 1;
  if (splits.empty()) {
    DTENSOR_CHECK(rows % n == 0, "dtensor: all_to_all: ", rows, " rows of the ", which, " do not split evenly over ",
                  n, " ranks");
    return std::vector<int64_t>(n, rows / n);
  }
  DTENSOR_CHECK(static_cast<int>(splits.size()) == n &&
                    std::accumulate(splits.begin(), splits.end(), int64_t{0}) == rows,
                "dtensor: all_to_all: ", which, " splits do not sum to its ", rows, " rows over ", n, " ranks");
  return splits;
}

}  // namespace

ShmBackend::ShmBackend(std::unique_ptr<ShmComm> comm, c10::intrusive_ptr<c10d::Backend> fallback)
    : c10d::Backend(comm->rank(), comm->size()), comm_(std::move(comm)), fallback_(std::move(fallback)) {}

template <typename Issue>
c10::intrusive_ptr<c10d::Work> ShmBackend::to_fallback(const char* collective, const std::vector<int64_t>& descriptor,
                                                       Issue&& issue) {
  c10::intrusive_ptr<c10d::Work> work;
  queue_.run_after_queue([&] {
    comm_->agree(collective, descriptor);
    work = issue();
  }, comm_->timeout());
  return work;
}

c10::intrusive_ptr<c10d::Work> ShmBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  Reduction op;
  const bool fast = tensors.size() == 1 && covered(tensors[0]) && reduction_of(opts.reduceOp, &op);
  auto d = size_descriptor(SizedCollective::ALL_REDUCE, tensors.at(0), {}, {}, {}, size_);
  if (!fast) return to_fallback("all_reduce", d, [&] { return fallback_->allreduce(tensors, opts); });
  return queue_.issue(c10d::OpType::ALLREDUCE, opts.asyncOp,
                      [this, t = tensors[0], op, d] { comm_->all_reduce(t, op, d); });
}

c10::intrusive_ptr<c10d::Work> ShmBackend::_allgather_base(at::Tensor& out, at::Tensor& in,
                                                           const c10d::AllgatherOptions& opts) {
  auto d = size_descriptor(SizedCollective::ALL_GATHER, in, out, {}, {}, size_);
  if (!(covered(in) && covered(out) && in.scalar_type() == out.scalar_type())) {
    return to_fallback("all_gather", d, [&] { return fallback_->_allgather_base(out, in, opts); });
  }
  return queue_.issue(c10d::OpType::_ALLGATHER_BASE, opts.asyncOp,
                      [this, out, in, d] { comm_->all_gather(out, in, d); });
}

c10::intrusive_ptr<c10d::Work> ShmBackend::_reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                                const c10d::ReduceScatterOptions& opts) {
  Reduction op;
  auto d = size_descriptor(SizedCollective::REDUCE_SCATTER, in, out, {}, {}, size_);
  if (!(covered(in) && covered(out) && in.scalar_type() == out.scalar_type() && reduction_of(opts.reduceOp, &op))) {
    return to_fallback("reduce_scatter", d, [&] { return fallback_->_reduce_scatter_base(out, in, opts); });
  }
  return queue_.issue(c10d::OpType::_REDUCE_SCATTER_BASE, opts.asyncOp,
                      [this, out, in, op, d] { comm_->reduce_scatter(out, in, op, d); });
}

c10::intrusive_ptr<c10d::Work> ShmBackend::alltoall_base(at::Tensor& out, at::Tensor& in,
                                                         std::vector<int64_t>& out_splits,
                                                         std::vector<int64_t>& in_splits,
                                                         const c10d::AllToAllOptions& opts) {
  auto d = size_descriptor(SizedCollective::ALL_TO_ALL, in, out, in_splits, out_splits, size_);
  if (!(covered(in) && covered(out) && in.scalar_type() == out.scalar_type())) {
    return to_fallback("all_to_all", d, [&] { return fallback_->alltoall_base(out, in, out_splits, in_splits, opts); });
  }
  auto ins = splits_or_equal(in_splits, in, size_, "input");
  auto outs = splits_or_equal(out_splits, out, size_, "output");
  return queue_.issue(c10d::OpType::ALLTOALL_BASE, opts.asyncOp,
                      [this, out, in, outs, ins, d] { comm_->all_to_all(out, in, outs, ins, d); });
}

c10::intrusive_ptr<c10d::Work> ShmBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                     const c10d::BroadcastOptions& opts) {
  auto d = size_descriptor(SizedCollective::BROADCAST, tensors.at(0), {}, {}, {}, size_);
  if (!(tensors.size() == 1 && covered(tensors[0]))) {
    return to_fallback("broadcast", d, [&] { return fallback_->broadcast(tensors, opts); });
  }
  return queue_.issue(c10d::OpType::BROADCAST, opts.asyncOp,
                      [this, t = tensors[0], root = static_cast<int>(opts.rootRank), d] { comm_->broadcast(t, root, d); });
}

c10::intrusive_ptr<c10d::Work> ShmBackend::barrier(const c10d::BarrierOptions& opts) {
  return queue_.issue(c10d::OpType::BARRIER, opts.asyncOp, [this, d = size_descriptor(SizedCollective::BARRIER, {}, {},
                                                                                       {}, {}, size_)] {
    comm_->agree("barrier", d);
  });
}

}  // namespace dtensor::detail::shm
