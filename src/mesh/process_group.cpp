// ProcessGroup (a c10d backend with bounded waits, errors that name the collective and the group, and
// a health state shared with its Works) and Work. World and init_process_group are in world.cpp.
#include "dtensor/mesh/process_group.h"
#include "dtensor/mesh/comm_clock.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <iostream>
#include <mutex>
#include <stdexcept>

#include "dtensor/core/error.h"
#include "dtensor/mesh/comm_hooks.h"
#include "mesh/deadline.h"
#include "mesh/heartbeat.h"
#include "mesh/group_text.h"
#include "mesh/shm/shm_backend.h"
#include "mesh/size_agreement.h"

namespace dtensor {
using detail::describe_group;
using detail::message_of;

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG:  // Gloo has no AVG: SUM, then divide (see finish callbacks below)
      return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::MAX: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::MIN: return c10d::ReduceOp(c10d::ReduceOp::MIN);
  }
  throw dtensor::Error("unreachable");
}

int64_t nbytes(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

void check_contiguous(const at::Tensor& t, const char* what) {
  DTENSOR_CHECK(t.is_contiguous(), "dtensor: ", what, " needs a contiguous tensor");
}

}  // namespace

// Whether a group is still usable: the first failure of one of its collectives, once there is one.
struct detail::GroupHealth {
  std::mutex mutex;
  std::string first_failure;
  std::atomic<bool> failed{false};
  std::function<std::string()> describe_members;  // ProcessGroup::set_member_diagnosis
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failed.exchange(true)) first_failure = why;
  }
  std::string why() {
    std::lock_guard<std::mutex> lock(mutex);
    return first_failure;
  }
};

namespace {

// A failed collective's error `why`, with what became of the other members (host_identity.h: read from what
// they published when the group was made, and from /proc; no store, whose server may be the member that died).
std::string with_members(const detail::GroupHealth& health, const std::string& why) {
  if (!health.describe_members) return why;
  return why + "; members: " + health.describe_members();
}

}  // namespace

// ---------------------------------------------------------------------------------------------------- Work

struct Work::State {
  c10::intrusive_ptr<c10d::Work> work;
  std::string what;  // "all_reduce on group [0, 1] (rank 0 of 2)"
  std::chrono::milliseconds timeout;
  std::function<void()> finish;
  std::shared_ptr<detail::GroupHealth> health;
};

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (state_) {
      try { wait(); } catch (const std::exception& e) { std::cerr << (std::string(e.what()) + "\n") << std::flush; }
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

namespace {

// comm_clock.h: nested scopes (a blocking collective's wait inside its start) count once.
thread_local int64_t exposed_ns = 0;
thread_local int clock_depth = 0;

struct CommClock {
  std::chrono::steady_clock::time_point start;
  CommClock() {
    if (clock_depth++ == 0) start = std::chrono::steady_clock::now();
  }
  ~CommClock() {
    if (--clock_depth == 0) {
      exposed_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    }
  }
};

}  // namespace

int64_t exposed_comm_ns() { return exposed_ns; }

Work::~Work() {
  if (state_) {
    try {
      wait();
    } catch (const std::exception& e) {
      std::cerr << ("dtensor: an unwaited collective failed: " + std::string(e.what()) + "\n") << std::flush;
    }
  }
}

Work::Work() noexcept = default;
Work::Work(Work&&) noexcept = default;

void Work::wait() {
  if (!state_) return;
  const CommClock clock;
  auto state = std::move(state_);
  // A group that already failed has a peer that will not answer: do not wait another timeout for it.
  DTENSOR_CHECK(!state->health->failed || state->work->isCompleted(), "dtensor: ", state->what,
                " was not waited for: the group failed earlier (", state->health->why(), ")");
  bool completed = false;
  detail::CollectiveWaitMark mark;  // tprun's watchdog: blocked in a collective, then progress
  try {
    completed = state->work->wait(state->timeout);
  } catch (const dtensor::Error&) {
    throw;  // the shared-memory backend's, which already names the collective, the group and the peer
  } catch (const std::exception& e) {
    std::string why = with_members(*state->health, state->what + " failed: " + message_of(e));
    state->health->fail(why);
    throw DTENSOR_ERROR("dtensor: ", why);
  }
  if (!completed) {
    std::string why = with_members(*state->health, state->what + " did not complete within " +
                                                       std::to_string(state->timeout.count()) +
                                                       " ms (a peer of the group died, froze or never called it)");
    state->health->fail(why);
    throw DTENSOR_ERROR("dtensor: ", why);
  }
  mark.succeeded();
  if (state->finish) state->finish();
}

// ---------------------------------------------------------------------------------------------- ProcessGroup

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> global_ranks,
                           int global_rank, std::chrono::milliseconds timeout, bool peerless)
    : backend_(std::move(backend)), health_(std::make_shared<detail::GroupHealth>()), ranks_(std::move(global_ranks)),
      rank_(-1), timeout_(timeout) {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == global_rank) rank_ = static_cast<int>(i);
  }
  DTENSOR_CHECK(rank_ >= 0, "dtensor: rank ", global_rank, " is not in ", describe());
  // Shared memory checks sizes within the collective; a peerless group has no peers to disagree with.
  in_band_sizes_ = peerless || backend_->getBackendName() == detail::shm::kBackendName;
}

ProcessGroup::~ProcessGroup() {
  // Gloo's destructor waits for its queue to drain and joins its workers, which may still wait on the
  // peer that failed us (up to a timeout per queued collective): leak the backend instead.
  if (health_->failed) detail::leak_deliberately(std::move(backend_));
}

void ProcessGroup::mark_failed(const std::string& why) { health_->fail(why); }

void ProcessGroup::set_member_diagnosis(std::function<std::string()> describe) {
  health_->describe_members = std::move(describe);
}

std::string ProcessGroup::with_member_states(const std::string& why) const { return with_members(*health_, why); }
bool ProcessGroup::failed() const { return health_->failed; }

std::string ProcessGroup::describe() const {
  return describe_group(ranks_, rank_);
}

std::string ProcessGroup::backend_name() const { return backend_->getBackendName(); }

c10d::Backend& ProcessGroup::backend_for(const at::Tensor& t) {
  if (!t.is_cuda()) return *backend_;
  std::call_once(cuda_backend_once_, [&] {
    DTENSOR_CHECK(make_cuda_backend_, "dtensor: ", describe(), " has no backend for CUDA tensors");
    cuda_backend_ = make_cuda_backend_();
  });
  return *cuda_backend_;
}

Work ProcessGroup::start(const char* collective, int64_t bytes, bool async_op,
                         const std::function<c10::intrusive_ptr<c10d::Work>()>& issue, std::function<void()> finish,
                         const std::function<void()>& alone) {
  // A group of one rank communicates with no one: the collective is its local result (the caller's copy),
  // with no backend call and nothing for the comm observers, as PyTorch skips size-1 mesh dims.
  if (size() == 1) {
    if (alone) alone();
    return Work();
  }
  const CommClock clock;
  std::string what = std::string(collective) + " on " + describe();
  DTENSOR_CHECK(!health_->failed, "dtensor: ", what, " cannot start: the group failed earlier (", health_->why(),
                "); a failed group cannot be used again");
  detail::notify_comm_observers(CommEvent{collective, bytes, size(), &ranks_, async_op});
  c10::intrusive_ptr<c10d::Work> work;
  try {
    detail::CollectiveWaitMark mark;  // the shared-memory backend blocks here, at issue
    work = issue();
  } catch (const dtensor::Error& e) {
    // The shm backend runs the collective at issue: a peer that failed it fails the group (a size mismatch
    // does not: every rank saw it, and the group is still whole).
    if (backend_->getBackendName() == detail::shm::kBackendName &&
        static_cast<detail::shm::ShmBackend&>(*backend_).comm_broken()) {
      std::string why = e.what();
      health_->fail(why.rfind("dtensor: ", 0) == 0 ? why.substr(9) : why);
    }
    throw;  // ours already names the collective and the group
  } catch (const std::exception& e) {
    std::string why = with_members(*health_, what + " failed to start: " + message_of(e));
    health_->fail(why);
    throw DTENSOR_ERROR("dtensor: ", why);
  }
  Work w;
  w.state_ = std::make_unique<Work::State>(
      Work::State{std::move(work), std::move(what), timeout_, std::move(finish), health_});
  return w;
}

Work ProcessGroup::all_reduce(at::Tensor& tensor, ReduceOp op, bool async_op) {
  check_contiguous(tensor, "all_reduce");
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = timeout_;
  opts.asyncOp = async_op;
  std::function<void()> finish;
  if (op == ReduceOp::AVG) finish = [tensor, n = size()]() mutable { tensor.div_(n); };
  detail::agree_on_sizes(*this, detail::SizedCollective::ALL_REDUCE, tensor, {});
  return start("all_reduce", nbytes(tensor), async_op, [&] { return backend_for(tensor).allreduce(tensors, opts); }, std::move(finish));
}

Work ProcessGroup::all_gather(at::Tensor& out, at::Tensor& in, bool async_op, bool agree) {
  check_contiguous(out, "all_gather");
  check_contiguous(in, "all_gather");
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = async_op;
  if (agree) detail::agree_on_sizes(*this, detail::SizedCollective::ALL_GATHER, in, out);
  return start("all_gather", nbytes(in), async_op, [&] { return backend_for(in)._allgather_base(out, in, opts); }, {},
               [&] { out.copy_(in.view(out.sizes())); });
}

std::vector<int64_t> ProcessGroup::exchange_row_counts(const at::Tensor& rows) {
  const int64_t n = size();
  const int64_t count = rows.dim() > 0 ? rows.size(0) : 1;
  if (!detail::needs_size_agreement(*this, rows)) {
    at::Tensor mine = at::full({1}, count, at::kLong);
    at::Tensor all = at::empty({n}, at::kLong);
    all_gather_into(all, mine);  // shared memory checks it in band
    return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + n);
  }
  // One exchange in place of two: [this rank's descriptor of the gather, its row count].
  std::vector<int64_t> row = detail::size_descriptor(detail::SizedCollective::ALL_GATHER_ROWS, rows, {}, {}, {}, n);
  row.push_back(count);
  const int64_t len = static_cast<int64_t>(row.size());
  at::Tensor mine = at::from_blob(row.data(), {len}, at::kLong);
  at::Tensor all = at::empty({n * len}, at::kLong);
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  start("all_gather", static_cast<int64_t>(sizeof(int64_t)), false, [&] { return backend_->_allgather_base(all, mine, opts); })
      .wait();
  std::vector<const int64_t*> descriptors;
  std::vector<int64_t> counts;
  for (int64_t r = 0; r < n; ++r) {
    descriptors.push_back(all.data_ptr<int64_t>() + r * len);
    counts.push_back(all.data_ptr<int64_t>()[r * len + len - 1]);
  }
  detail::check_descriptors("all_gather on " + describe(), ranks_, descriptors);
  return counts;
}

Work ProcessGroup::reduce_scatter(at::Tensor& out, at::Tensor& in, ReduceOp op, bool async_op) {
  check_contiguous(out, "reduce_scatter");
  check_contiguous(in, "reduce_scatter");
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = to_c10d(op);
  opts.timeout = timeout_;
  opts.asyncOp = async_op;
  std::function<void()> finish;
  if (op == ReduceOp::AVG) finish = [out, n = size()]() mutable { out.div_(n); };
  detail::agree_on_sizes(*this, detail::SizedCollective::REDUCE_SCATTER, in, out);
  return start("reduce_scatter", nbytes(in), async_op, [&] { return backend_for(in)._reduce_scatter_base(out, in, opts); },
               std::move(finish), [&] { out.copy_(in.view(out.sizes())); });
}

Work ProcessGroup::all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_splits,
                              std::vector<int64_t> in_splits, bool async_op) {
  check_contiguous(out, "all_to_all");
  check_contiguous(in, "all_to_all");
  c10d::AllToAllOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = async_op;
  detail::agree_on_sizes(*this, detail::SizedCollective::ALL_TO_ALL, in, out, in_splits, out_splits);
  return start("all_to_all", nbytes(in), async_op, [&] { return backend_for(in).alltoall_base(out, in, out_splits, in_splits, opts); },
               {}, [&] { out.copy_(in.view(out.sizes())); });
}

Work ProcessGroup::broadcast(at::Tensor& tensor, int src_group_rank, bool async_op) {
  check_contiguous(tensor, "broadcast");
  DTENSOR_CHECK(src_group_rank >= 0 && src_group_rank < size(), "dtensor: broadcast source ", src_group_rank,
                " is not a rank of ", describe());
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = src_group_rank;
  opts.timeout = timeout_;
  opts.asyncOp = async_op;
  int64_t bytes = rank_ == src_group_rank ? nbytes(tensor) : 0;
  detail::agree_on_sizes(*this, detail::SizedCollective::BROADCAST, tensor, {});
  return start("broadcast", bytes, async_op, [&] { return backend_for(tensor).broadcast(tensors, opts); });
}

namespace {
// The backend that carries point-to-point for `b`: shared memory's Gloo fallback, else b itself.
c10d::Backend& p2p_backend(c10d::Backend& b) {
  if (b.getBackendName() == detail::shm::kBackendName) return static_cast<detail::shm::ShmBackend&>(b).fallback();
  return b;
}
}  // namespace

Work ProcessGroup::send_async(at::Tensor& tensor, int dst_group_rank, int tag) {
  check_contiguous(tensor, "send");
  DTENSOR_CHECK(dst_group_rank >= 0 && dst_group_rank < size() && dst_group_rank != rank_, "dtensor: send to rank ",
                dst_group_rank, " of ", describe(), ": not another member");
  std::vector<at::Tensor> tensors{tensor};
  return start("send", nbytes(tensor), true,
               [&] { return p2p_backend(backend_for(tensor)).send(tensors, dst_group_rank, tag); });
}

Work ProcessGroup::recv_async(at::Tensor& tensor, int src_group_rank, int tag) {
  check_contiguous(tensor, "recv");
  DTENSOR_CHECK(src_group_rank >= 0 && src_group_rank < size() && src_group_rank != rank_, "dtensor: recv from rank ",
                src_group_rank, " of ", describe(), ": not another member");
  std::vector<at::Tensor> tensors{tensor};
  return start("recv", 0, true,
               [&] { return p2p_backend(backend_for(tensor)).recv(tensors, src_group_rank, tag); });
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = false;
  start("barrier", 0, false, [&] { return backend_->barrier(opts); }).wait();
}

}  // namespace dtensor
