// ProcessGroup, World and init_process_group over c10d (TCPStore, PrefixStore, ProcessGroupGloo).
// This is the only translation unit that includes ProcessGroupGloo.hpp (and with it gloo's headers).
#include "dtensor/error.h"
#include "dtensor/mesh/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/launch_env.h"
#include "mesh/cuda_support.h"
#include "mesh/deadline.h"
#include "mesh/fake_backend.h"
#include "mesh/host_identity.h"
#include "mesh/host_staged_backend.h"
#include "mesh/rendezvous.h"
#include "mesh/shm/shm_backend.h"
#include "mesh/size_agreement.h"

namespace dtensor {
namespace {

std::string join(const std::vector<int>& v, const char* sep) {
  std::ostringstream os;
  for (size_t i = 0; i < v.size(); ++i) os << (i ? sep : "") << v[i];
  return os.str();
}

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
  if (!t.is_contiguous()) throw dtensor::Error(std::string("dtensor: ") + what + " needs a contiguous tensor");
}

// c10 errors carry a C++ backtrace in what(); users need the message.
std::string message_of(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

std::string joined_key(int group_rank) { return "joined/" + std::to_string(group_rank); }

// For an error while building a group: which members never announced themselves on the group's store. The
// store may be what failed (its server, rank 0, dead or frozen), so the question gets at most 2 s.
std::string absent_members(const c10::intrusive_ptr<c10d::Store>& group_store, const std::vector<int>& global_ranks,
                           std::chrono::milliseconds timeout) {
  auto answer = std::make_shared<std::string>();
  bool answered = false;
  try {
    answered = detail::finish_within(std::min(timeout, std::chrono::milliseconds(2000)), [=] {
      std::vector<int> absent, present;
      for (size_t i = 0; i < global_ranks.size(); ++i) {
        (group_store->check({joined_key(static_cast<int>(i))}) ? present : absent).push_back(global_ranks[i]);
      }
      *answer = absent.empty() ? "every member arrived (" + join(present, ", ") + "), so one died or froze since"
                               : "members [" + join(absent, ", ") + "] never arrived (arrived: [" +
                                     join(present, ", ") + "])";
    });
  } catch (const std::exception& e) {
    return "the store (served by rank 0) failed too: " + message_of(e);
  }
  return answered ? *answer : "the store (served by rank 0) did not answer within 2 s: rank 0 died or froze";
}

std::string describe_group(const std::vector<int>& ranks, int group_rank) {
  return "group [" + join(ranks, ", ") + "] (rank " + std::to_string(group_rank) + " of " +
         std::to_string(ranks.size()) + ")";
}

// An InitOptions choice: `requested`, else the environment variable, else `fallback`; one of `allowed` (the
// error names where the value came from and what is allowed). Checked when the world is made.
std::string resolve_choice(const std::string& requested, const char* option, const char* env_name,
                           const char* fallback, const std::vector<std::string>& allowed, const char* what) {
  std::string mode = requested;
  std::string from = option;
  if (mode.empty()) {
    const char* env = std::getenv(env_name);
    mode = env && *env ? env : fallback;
    from = env_name;
  }
  if (mode == "fake" && from == "InitOptions::backend") return mode;  // fake_world's, never the env's
  if (std::find(allowed.begin(), allowed.end(), mode) == allowed.end()) {
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
    }
    throw dtensor::Error("dtensor: " + from + "=" + mode + " is not " + what + " (" + list + ")");
  }
  return mode;
}

std::string resolve_backend(const std::string& requested) {
  return resolve_choice(requested, "InitOptions::backend", "DTENSOR_BACKEND", "auto", {"auto", "gloo", "shm"},
                        "a backend");
}

std::string resolve_cuda_backend(const std::string& requested) {
  return resolve_choice(requested, "InitOptions::cuda_backend", "DTENSOR_CUDA_BACKEND", "nccl", {"nccl", "gloo"},
                        "a CUDA backend");
}

std::chrono::milliseconds resolve_timeout(std::chrono::milliseconds requested) {
  if (requested.count() > 0) return requested;
  return std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds_from_environ(300.0) * 1000));
}

}  // namespace

// Whether a group is still usable: the first failure of one of its collectives, once there is one.
struct detail::GroupHealth {
  std::mutex mutex;
  std::string first_failure;
  std::atomic<bool> failed{false};
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!failed.exchange(true)) first_failure = why;
  }
  std::string why() {
    std::lock_guard<std::mutex> lock(mutex);
    return first_failure;
  }
};

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
      try { wait(); } catch (const std::exception& e) { std::cerr << e.what() << std::endl; }
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

Work::~Work() {
  if (state_) {
    try {
      wait();
    } catch (const std::exception& e) {
      std::cerr << "dtensor: an unwaited collective failed: " << e.what() << std::endl;
    }
  }
}

void Work::wait() {
  if (!state_) return;
  auto state = std::move(state_);
  // A group that already failed has a peer that will not answer: do not wait another timeout for it.
  if (state->health->failed && !state->work->isCompleted()) {
    throw dtensor::Error("dtensor: " + state->what + " was not waited for: the group failed earlier (" +
                         state->health->why() + ")");
  }
  bool completed = false;
  try {
    completed = state->work->wait(state->timeout);
  } catch (const dtensor::Error&) {
    throw;  // the shared-memory backend's, which already names the collective, the group and the peer
  } catch (const std::exception& e) {
    std::string why = state->what + " failed: " + message_of(e);
    state->health->fail(why);
    throw dtensor::Error("dtensor: " + why);
  }
  if (!completed) {
    std::string why = state->what + " did not complete within " + std::to_string(state->timeout.count()) +
                      " ms (a peer of the group died, froze or never called it)";
    state->health->fail(why);
    throw dtensor::Error("dtensor: " + why);
  }
  if (state->finish) state->finish();
}

// ---------------------------------------------------------------------------------------------- ProcessGroup

ProcessGroup::ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> global_ranks,
                           int global_rank, std::chrono::milliseconds timeout)
    : backend_(std::move(backend)), health_(std::make_shared<detail::GroupHealth>()), ranks_(std::move(global_ranks)),
      rank_(-1), timeout_(timeout) {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == global_rank) rank_ = static_cast<int>(i);
  }
  if (rank_ < 0) throw dtensor::Error("dtensor: rank " + std::to_string(global_rank) + " is not in " + describe());
  // Shared memory checks sizes within the collective; a fake group has no peers to disagree with.
  in_band_sizes_ = backend_->getBackendName() == detail::shm::kBackendName ||
                   backend_->getBackendName() == detail::kFakeBackendName;
}

ProcessGroup::~ProcessGroup() {
  // Gloo's destructor waits for its queue to drain and joins its workers, which may still wait on the
  // peer that failed us (up to a timeout per queued collective): leak the backend instead.
  if (health_->failed) detail::leak_deliberately(std::move(backend_));
}

void ProcessGroup::mark_failed(const std::string& why) { health_->fail(why); }
bool ProcessGroup::failed() const { return health_->failed; }

std::string ProcessGroup::describe() const {
  return describe_group(ranks_, rank_);
}

std::string ProcessGroup::backend_name() const { return backend_->getBackendName(); }

c10d::Backend& ProcessGroup::backend_for(const at::Tensor& t) {
  if (!t.is_cuda()) return *backend_;
  std::call_once(cuda_backend_once_, [&] {
    if (!make_cuda_backend_) throw dtensor::Error("dtensor: " + describe() + " has no backend for CUDA tensors");
    cuda_backend_ = make_cuda_backend_();
  });
  return *cuda_backend_;
}

Work ProcessGroup::start(const char* collective, int64_t bytes,
                         const std::function<c10::intrusive_ptr<c10d::Work>()>& issue, std::function<void()> finish,
                         const std::function<void()>& alone) {
  // A group of one rank communicates with no one: the collective is its local result (the caller's copy),
  // with no backend call and nothing for the comm observers, as PyTorch skips size-1 mesh dims.
  if (size() == 1) {
    if (alone) alone();
    return Work();
  }
  std::string what = std::string(collective) + " on " + describe();
  if (health_->failed) {
    throw dtensor::Error("dtensor: " + what + " cannot start: the group failed earlier (" + health_->why() +
                         "); a failed group cannot be used again");
  }
  detail::notify_comm_observers(CommEvent{collective, bytes, size(), &ranks_});
  c10::intrusive_ptr<c10d::Work> work;
  try {
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
    health_->fail(what + " failed to start: " + message_of(e));
    throw dtensor::Error("dtensor: " + what + " failed to start: " + message_of(e));
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
  return start("all_reduce", nbytes(tensor), [&] { return backend_for(tensor).allreduce(tensors, opts); }, std::move(finish));
}

Work ProcessGroup::all_gather(at::Tensor& out, at::Tensor& in, bool async_op) {
  check_contiguous(out, "all_gather");
  check_contiguous(in, "all_gather");
  c10d::AllgatherOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = async_op;
  detail::agree_on_sizes(*this, detail::SizedCollective::ALL_GATHER, in, out);
  return start("all_gather", nbytes(in), [&] { return backend_for(in)._allgather_base(out, in, opts); }, {},
               [&] { out.copy_(in.view(out.sizes())); });
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
  return start("reduce_scatter", nbytes(in), [&] { return backend_for(in)._reduce_scatter_base(out, in, opts); },
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
  return start("all_to_all", nbytes(in), [&] { return backend_for(in).alltoall_base(out, in, out_splits, in_splits, opts); },
               {}, [&] { out.copy_(in.view(out.sizes())); });
}

Work ProcessGroup::broadcast(at::Tensor& tensor, int src_group_rank, bool async_op) {
  check_contiguous(tensor, "broadcast");
  if (src_group_rank < 0 || src_group_rank >= size()) {
    throw dtensor::Error("dtensor: broadcast source " + std::to_string(src_group_rank) + " is not a rank of " +
                                describe());
  }
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = src_group_rank;
  opts.timeout = timeout_;
  opts.asyncOp = async_op;
  int64_t bytes = rank_ == src_group_rank ? nbytes(tensor) : 0;
  detail::agree_on_sizes(*this, detail::SizedCollective::BROADCAST, tensor, {});
  return start("broadcast", bytes, [&] { return backend_for(tensor).broadcast(tensors, opts); });
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  opts.asyncOp = false;
  start("barrier", 0, [&] { return backend_->barrier(opts); }).wait();
}

// ---------------------------------------------------------------------------------------------------- World

struct World::Groups {
  std::mutex mutex;
  std::map<std::vector<int>, std::shared_ptr<ProcessGroup>> by_ranks;
};

World::World(c10::intrusive_ptr<c10d::Store> store, int rank, int size, InitOptions options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)),
      groups_(std::make_unique<Groups>()) {
  options_.timeout = resolve_timeout(options_.timeout);
  options_.backend = resolve_backend(options_.backend);
  options_.cuda_backend = resolve_cuda_backend(options_.cuda_backend);
  if (size < 1 || rank < 0 || rank >= size) {
    throw dtensor::Error("dtensor: rank " + std::to_string(rank) + " is outside [0, world size " +
                                std::to_string(size) + ")");
  }
  if (options_.backend != "gloo" && options_.backend != "fake") {
    try {
      detail::publish_host_identity(*store_, rank_);  // one store op: bounded by the store's timeout
    } catch (const std::exception& e) {
      throw dtensor::Error("dtensor: rank " + std::to_string(rank_) + " could not publish its host on the store "
                           "(served by rank 0) within " + std::to_string(options_.timeout.count()) + " ms: " +
                           message_of(e));
    }
  }
}

World::~World() = default;

std::shared_ptr<ProcessGroup> World::group(const std::vector<int>& global_ranks) {
  std::set<int> unique(global_ranks.begin(), global_ranks.end());
  if (unique.size() != global_ranks.size() || global_ranks.empty() || *unique.begin() < 0 ||
      *unique.rbegin() >= size_) {
    throw dtensor::Error("dtensor: invalid process group ranks [" + join(global_ranks, ", ") +
                                "] in a world of " + std::to_string(size_));
  }
  std::lock_guard<std::mutex> lock(groups_->mutex);
  auto it = groups_->by_ranks.find(global_ranks);
  if (it != groups_->by_ranks.end()) return it->second;

  int group_rank = -1;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    if (global_ranks[i] == rank_) group_rank = static_cast<int>(i);
  }
  if (group_rank < 0) {
    throw dtensor::Error("dtensor: rank " + std::to_string(rank_) + " is not a member of group [" +
                                join(global_ranks, ", ") + "]");
  }
  if (options_.backend == "fake") {
    auto group = std::make_shared<ProcessGroup>(detail::make_fake_backend(group_rank, static_cast<int>(global_ranks.size())),
                                                global_ranks, rank_, options_.timeout);
    groups_->by_ranks.emplace(global_ranks, group);
    return group;
  }
  // Each member builds its own backend under a prefix derived from the rank list alone, so all members
  // agree on it without talking (C++ has no new_group). Every step waits on the other members (through the
  // store, or Gloo's TCP pairs) and is bounded by the timeout; a failure names the step and who is absent.
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dtensor/pg/" + join(global_ranks, ","), store_);
  // The steps also run under a deadline of their own (timeout + 2 s) on a helper thread: c10d's store server
  // serves its clients from one loop, so a member frozen in the middle of a store request can stall every
  // store op of every rank with no timeout firing. Past the deadline the helper is abandoned (deadline.h).
  auto slot = std::make_shared<c10::intrusive_ptr<c10d::Backend>>();
  auto step = std::make_shared<std::atomic<const char*>>("announcing itself on the store");
  const auto bound = options_.timeout + std::chrono::milliseconds(2000);
  const std::string what = "dtensor: rank " + std::to_string(rank_) + " could not connect process group [" +
                           join(global_ranks, ", ") + "] within ";
  bool finished = false;
  try {
    finished = detail::finish_within(bound, [this, slot, step, prefixed, global_ranks, group_rank] {
      prefixed->set(joined_key(group_rank), std::vector<uint8_t>{1});
      *step = "connecting Gloo (addresses through the store, then a TCP pair to each member)";
      auto made = connect_gloo(prefixed, group_rank, static_cast<int>(global_ranks.size()));
      if (options_.backend != "gloo" && global_ranks.size() > 1) {
        *step = "setting up shared memory (comparing hosts, mapping the segment)";
        made = with_shared_memory(std::move(made), *prefixed, global_ranks, group_rank);
      }
      *slot = std::move(made);
    });
  } catch (const std::exception& e) {
    throw dtensor::Error(what + std::to_string(options_.timeout.count()) + " ms while " + step->load() + ": " +
                         absent_members(prefixed, global_ranks, options_.timeout) + ": " + message_of(e));
  }
  if (!finished) {
    throw dtensor::Error(what + std::to_string(bound.count()) + " ms: still blocked while " + step->load() +
                         " (a member, or the store's server rank 0, froze): " +
                         absent_members(prefixed, global_ranks, options_.timeout));
  }
  c10::intrusive_ptr<c10d::Backend> backend = std::move(*slot);
  auto group = std::make_shared<ProcessGroup>(backend, global_ranks, rank_, options_.timeout);
  group->set_cuda_backend_factory(cuda_backend_factory(backend, global_ranks, group_rank));
  groups_->by_ranks.emplace(global_ranks, group);
  return group;
}

c10::intrusive_ptr<c10d::Backend> World::connect_gloo(const c10::intrusive_ptr<c10d::Store>& group_store, int group_rank,
                                                     int group_size) {
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options_.timeout);  // connect and every op
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (!options_.gloo_hostname.empty()) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(options_.gloo_hostname));
  } else if (ifname != nullptr && *ifname != '\0') {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(group_store, group_rank, group_size, gloo_options);
}

// The same-host backend over `gloo` when every member runs on this host (else `gloo` itself, or an error when
// shared memory was required). Collective over the members, like Gloo's creation.
c10::intrusive_ptr<c10d::Backend> World::with_shared_memory(c10::intrusive_ptr<c10d::Backend> gloo,
                                                            c10d::Store& group_store,
                                                            const std::vector<int>& global_ranks, int group_rank) {
  const bool one_host = detail::members_share_host(*store_, global_ranks);
  const bool fits = global_ranks.size() <= static_cast<size_t>(detail::shm::kMaxRanks);
  if (!one_host || !fits) {
    if (options_.backend == "shm") {
      throw dtensor::Error("dtensor: group [" + join(global_ranks, ", ") + "] cannot use shared memory (backend shm): " +
                           (one_host ? "more than " + std::to_string(detail::shm::kMaxRanks) + " ranks"
                                     : std::string("its ranks run on different hosts")));
    }
    return gloo;
  }
  auto segment = detail::shm::Segment::open_for_group(group_store, group_rank, static_cast<int>(global_ranks.size()),
                                                      join(global_ranks, "."),
                                                      detail::shm::chunk_bytes_from_environ(), options_.timeout);
  auto comm = std::make_unique<detail::shm::ShmComm>(std::move(segment), group_rank, global_ranks,
                                                     describe_group(global_ranks, group_rank), options_.timeout);
  return c10::make_intrusive<detail::shm::ShmBackend>(std::move(comm), std::move(gloo));
}

// What a group gives its CUDA tensors (InitOptions::cuda_backend): NCCL over a store prefix of its own, or
// host staging over the group's CPU backend.
ProcessGroup::BackendFactory World::cuda_backend_factory(c10::intrusive_ptr<c10d::Backend> cpu,
                                                          const std::vector<int>& global_ranks, int group_rank) {
  // By value: a group may outlive its world.
  return [cpu = std::move(cpu), global_ranks, group_rank, store = store_, rank = rank_,
          mode = options_.cuda_backend, timeout = options_.timeout]() -> c10::intrusive_ptr<c10d::Backend> {
    if (mode == "gloo") return c10::make_intrusive<detail::HostStagedBackend>(cpu, timeout);
    std::string why;
    const detail::CudaSupport* cuda = detail::cuda_support(&why);
    if (!cuda) throw dtensor::Error("dtensor: CUDA tensors in group [" + join(global_ranks, ", ") + "]: " + why);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dtensor/nccl/" + join(global_ranks, ","), store);
    try {
      return cuda->make_nccl_backend(prefixed, group_rank, static_cast<int>(global_ranks.size()), timeout);
    } catch (const std::exception& e) {
      throw dtensor::Error("dtensor: rank " + std::to_string(rank) + " could not create the NCCL group [" +
                           join(global_ranks, ", ") + "]: " + message_of(e));
    }
  };
}

std::shared_ptr<ProcessGroup> World::world_group() {
  std::vector<int> all(size_);
  for (int r = 0; r < size_; ++r) all[r] = r;
  return group(all);
}

// ------------------------------------------------------------------------------------- init_process_group

namespace {

// Drops `world`. When that is its last reference, the teardown (each backend's destructor: Gloo joins its
// worker threads) runs on a helper thread bounded by the world's timeout; past it the teardown is abandoned
// to the OS with a message, and false returned. Backends of failed groups are leaked, not joined (see
// ~ProcessGroup), so this bound is a safety net for what we did not foresee.
bool release_within_timeout(std::shared_ptr<World>& world) {
  if (!world) return true;
  if (world.use_count() > 1) {
    world.reset();
    return true;
  }
  const auto limit = world->timeout();
  const int rank = world->rank();
  if (detail::finish_within(limit, [last = std::move(world)]() mutable { last.reset(); })) return true;
  std::cerr << "dtensor: rank " << rank << ": shutting down its process groups did not finish within "
            << limit.count() << " ms (a peer is not answering); leaving them to the OS" << std::endl;
  return false;
}

// Holds a thread's or the process's world; the process's is torn down at exit, where an overrun ends the
// process at once (static destructors of LibTorch must not run under a thread still inside Gloo).
struct WorldSlot {
  std::shared_ptr<World> world;
  bool at_exit = false;
  ~WorldSlot() {
    try {
      if (!release_within_timeout(world) && at_exit) {
        std::cerr << "dtensor: exiting with status 1 without finishing the shutdown" << std::endl;
        std::_Exit(1);
      }
    } catch (const std::exception& e) {
      std::cerr << "dtensor: shutting down the process groups failed: " << e.what() << std::endl;
    }
  }
};

thread_local WorldSlot thread_world;
std::mutex process_world_mutex;
WorldSlot process_world{nullptr, true};

std::shared_ptr<World> install(std::shared_ptr<World> world) {
  world->world_group();  // connects every rank: a barrier that proves the job is whole
  thread_world.world = world;
  std::lock_guard<std::mutex> lock(process_world_mutex);
  if (!process_world.world) process_world.world = world;
  return world;
}
}  // namespace

std::shared_ptr<World> init_process_group(InitOptions options) {
  LaunchEnv env = LaunchEnv::from_environ();
  options.timeout = resolve_timeout(options.timeout);
  if (options.gloo_hostname.empty() && is_loopback(env.master_addr)) options.gloo_hostname = "127.0.0.1";
  auto store = detail::connect_store(env, options.timeout);
  // Bounded again from outside: a rank frozen in the middle of a store request can stall c10d's store
  // server for everyone, and store ops then block without their timeout firing (see World::group).
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const auto bound = options.timeout + std::chrono::milliseconds(2000);
  if (!detail::finish_within(bound, [store, env, timeout = options.timeout, where] {
        detail::wait_for_all_ranks(*store, env.rank, env.world_size, timeout, where);
      })) {
    throw dtensor::Error("dtensor: rank " + std::to_string(env.rank) + " of " + std::to_string(env.world_size) +
                         " could not rendezvous at " + where + " within " + std::to_string(bound.count()) +
                         " ms: the store (served by rank 0) stopped answering (rank 0, or a rank in the middle of "
                         "a store request, froze?)");
  }
  return install(std::make_shared<World>(std::move(store), env.rank, env.world_size, std::move(options)));
}

std::shared_ptr<World> init_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                          InitOptions options) {
  if (options.gloo_hostname.empty()) options.gloo_hostname = "127.0.0.1";
  options.timeout = resolve_timeout(options.timeout);
  store->setTimeout(options.timeout);  // the store's own get/wait are bounded like everything else
  detail::wait_for_all_ranks(*store, rank, size, options.timeout, "the caller's store");
  return install(std::make_shared<World>(std::move(store), rank, size, std::move(options)));
}

std::shared_ptr<World> current_world() {
  if (thread_world.world) return thread_world.world;
  std::lock_guard<std::mutex> lock(process_world_mutex);
  if (process_world.world) return process_world.world;
  throw dtensor::Error("dtensor: no process group; call dtensor::init_process_group() first");
}

bool is_initialized() {
  if (thread_world.world) return true;
  std::lock_guard<std::mutex> lock(process_world_mutex);
  return process_world.world != nullptr;
}

void destroy_process_group() {
  std::shared_ptr<World> mine = std::move(thread_world.world), process;
  {
    std::lock_guard<std::mutex> lock(process_world_mutex);
    if (!mine || process_world.world == mine) process = std::move(process_world.world);
  }
  if (process == mine) process.reset();  // one reference between the two slots
  release_within_timeout(mine);
  release_within_timeout(process);
}

}  // namespace dtensor
