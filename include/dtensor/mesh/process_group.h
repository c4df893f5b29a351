// A group of ranks with a c10d backend, and the world that creates and caches them. A group whose ranks all
// run on one host (hostname and boot id, compared through the store) talks through shared memory
// (src/mesh/shm/: a c10d backend that keeps Gloo for what it does not cover); any other group uses Gloo.
// DTENSOR_BACKEND=gloo, or InitOptions::backend = "gloo", forces Gloo everywhere.
//
// Our ProcessGroup wraps c10d's so that every collective is bounded by the group's timeout, fails with an
// error naming the collective, the group and the rank, and passes through the comm hooks (comm_hooks.h).
// c10d's heavy headers stay out of this header.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtensor/mesh/reduce_op.h"

namespace c10d {
class Store;
class Backend;
class Work;
}  // namespace c10d

namespace dtensor {

class ProcessGroup;
namespace detail {
struct GroupHealth;
// Worlds made so far in this process with real backends (not a dry run's peerless ones): the tests' record of which
// suites use a process group (tests/harness/gtest_main.cpp).
int64_t real_worlds_created();
}

// A handle on a collective in flight. wait() blocks at most the group's timeout and rethrows the peer's
// error with context. Destroying an unwaited Work waits for it (a collective cannot be abandoned), except
// once its group has failed: then it fails at once instead of waiting another timeout.
class Work {
 public:
  Work() noexcept;  // a finished collective (wait() returns at once)
  Work(Work&&) noexcept;  // out of line: State is complete only in process_group.cpp
  Work& operator=(Work&&) noexcept;
  ~Work();
  void wait();
  bool pending() const { return state_ != nullptr; }

 private:
  friend class ProcessGroup;
  struct State;
  std::unique_ptr<State> state_;
};

class ProcessGroup {
 public:
  // `peerless`: a backend with no peers to disagree with (InitOptions::make_backend's): sizes are not
  // exchanged before its collectives.
  ProcessGroup(c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> global_ranks, int global_rank,
               std::chrono::milliseconds timeout, bool peerless = false);
  ~ProcessGroup();

  int rank() const { return rank_; }                      // rank within the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }  // global ranks, group rank order
  std::chrono::milliseconds timeout() const { return timeout_; }
  std::string describe() const;                           // "group [0, 1] (rank 0 of 2)"

  // Raw collectives. They work in place / into caller-provided buffers of equal per-rank size, as c10d's.
  // Each *_async returns a Work to wait on later (on the same-host backend the collective then runs on the
  // group's worker thread, in issue order); the blocking forms run it and wait (c10d's asyncOp = false,
  // which lets that backend run it inline). Tensors must be contiguous.
  Work all_reduce_async(at::Tensor& tensor, ReduceOp op) { return all_reduce(tensor, op, true); }
  // out = cat([in from group rank 0, in from rank 1, ...], dim 0); out.numel() == size() * in.numel().
  Work all_gather_into_async(at::Tensor& out, at::Tensor& in) { return all_gather(out, in, true); }
  // out = reduce over ranks of in.chunk(size())[rank()] (dim 0, equal chunks).
  Work reduce_scatter_into_async(at::Tensor& out, at::Tensor& in, ReduceOp op) {
    return reduce_scatter(out, in, op, true);
  }
  // Rows of `in` (dim 0) go to ranks by in_splits; rows of `out` come from ranks by out_splits.
  Work all_to_all_single_async(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_splits,
                               std::vector<int64_t> in_splits) {
    return all_to_all(out, in, std::move(out_splits), std::move(in_splits), true);
  }
  Work broadcast_async(at::Tensor& tensor, int src_group_rank) { return broadcast(tensor, src_group_rank, true); }

  void all_reduce_(at::Tensor& tensor, ReduceOp op) { all_reduce(tensor, op, false).wait(); }
  void all_gather_into(at::Tensor& out, at::Tensor& in) { all_gather(out, in, false).wait(); }
  void reduce_scatter_into(at::Tensor& out, at::Tensor& in, ReduceOp op) { reduce_scatter(out, in, op, false).wait(); }
  void all_to_all_single(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_splits,
                         std::vector<int64_t> in_splits) {
    all_to_all(out, in, std::move(out_splits), std::move(in_splits), false).wait();
  }
  void broadcast_(at::Tensor& tensor, int src_group_rank) { broadcast(tensor, src_group_rank, false).wait(); }
  void barrier();

  // Point-to-point (c10d's send / recv: pipeline parallelism's activations and gradients). `tensor` goes to, or
  // arrives from, group rank `peer`; a send and a recv match by (pair of ranks, tag), so messages between one pair may
  // be posted in any order as long as their tags differ. Sizes are not agreed: the receiver's buffer must have the
  // sender's byte count (a mismatch fails the recv naming both). CPU tensors go through Gloo (the same-host backend's
  // Gloo too: shared memory carries collectives only); wait() is bounded by the group's timeout like a collective's.
  Work send_async(at::Tensor& tensor, int dst_group_rank, int tag);
  Work recv_async(at::Tensor& tensor, int src_group_rank, int tag);

  // Uneven all-gathers. Every member's row count (dim 0) of `rows`, before an all-gather of rows whose
  // counts may differ by rank: one small all-gather, which the comm hooks see as the exchange of one int64
  // per rank. Where sizes are agreed out of band (Gloo: mesh/size_agreement.h) each rank's size descriptor
  // travels in the same exchange, so the all-gather of the padded rows that follows (all_gather_agreed_into)
  // is not checked a second time.
  std::vector<int64_t> exchange_row_counts(const at::Tensor& rows);
  // all_gather_into of buffers whose shapes exchange_row_counts agreed on (every rank's rows padded to the
  // largest count).
  void all_gather_agreed_into(at::Tensor& out, at::Tensor& in) { all_gather(out, in, false, /*agree=*/false).wait(); }

  c10d::Backend& backend() const { return *backend_; }  // the CPU tensors' backend
  // CUDA tensors go to a second backend (NCCL, or host staging over the CPU backend: InitOptions::cuda_backend),
  // made by `factory` at the group's first CUDA collective, which every member reaches in the same order.
  using BackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>()>;
  void set_cuda_backend_factory(BackendFactory factory) { make_cuda_backend_ = std::move(factory); }
  // A collective of this group failed or timed out (a peer died, froze or gave up): the ranks no longer
  // agree on where the group stands, so every later collective fails at once naming `why`, and destroying
  // the group leaks its backend on purpose instead of joining worker threads that may wait on the peer
  // (docs/design/fault_tolerance.md). The library calls it; users need not.
  void mark_failed(const std::string& why);
  bool failed() const;
  // What the error of a failed collective says about the other members (World sets it: each member on this
  // host by its pid, "exited" / "stopped" / "running"; see host_identity.h); run at most once per failure,
  // bounded by 2 s.
  void set_member_diagnosis(std::function<std::string()> describe);
  // `why` (a collective's failure), followed by that diagnosis of the members when there is one.
  std::string with_member_states(const std::string& why) const;
  std::string backend_name() const;  // "dtensor_shm" (same-host shared memory) or "gloo"
  // The shared-memory backend checks collective sizes within the collective itself (size_agreement.h).
  bool checks_sizes_in_band() const { return in_band_sizes_; }

 private:
  // The collectives; `async_op` becomes c10d's asyncOp (false: the caller waits at once).
  Work all_reduce(at::Tensor& tensor, ReduceOp op, bool async_op);
  Work all_gather(at::Tensor& out, at::Tensor& in, bool async_op, bool agree = true);  // agree: agree_on_sizes first
  Work reduce_scatter(at::Tensor& out, at::Tensor& in, ReduceOp op, bool async_op);
  Work all_to_all(at::Tensor& out, at::Tensor& in, std::vector<int64_t> out_splits, std::vector<int64_t> in_splits,
                  bool async_op);
  Work broadcast(at::Tensor& tensor, int src_group_rank, bool async_op);
  // Runs the comm hooks, then `issue` (which starts the c10d collective), and wraps the result so that
  // wait() is bounded and errors carry context; `finish` runs after a successful wait.
  // Issues a collective through the backend; in a group of one rank runs `alone` (the local result)
  // instead.
  Work start(const char* collective, int64_t bytes, bool async_op, const std::function<c10::intrusive_ptr<c10d::Work>()>& issue,
             std::function<void()> finish = nullptr, const std::function<void()>& alone = nullptr);

  // The backend for `t`'s device.
  c10d::Backend& backend_for(const at::Tensor& t);

  c10::intrusive_ptr<c10d::Backend> backend_;
  BackendFactory make_cuda_backend_;
  std::once_flag cuda_backend_once_;
  c10::intrusive_ptr<c10d::Backend> cuda_backend_;
  std::shared_ptr<detail::GroupHealth> health_;  // shared with the Works in flight
  std::vector<int> ranks_;
  int rank_;
  std::chrono::milliseconds timeout_;
  bool in_band_sizes_ = false;
};

struct InitOptions {
  // Bound on every collective, store operation and rendezvous. Default: DTENSOR_TIMEOUT_SEC or 300 s.
  std::chrono::milliseconds timeout{0};
  // Host name / address the Gloo transport binds. Empty: 127.0.0.1 when MASTER_ADDR is a loopback address,
  // else the interface named by GLOO_SOCKET_IFNAME, else the machine's hostname when it resolves off loopback,
  // else the address of the interface that routes to MASTER_ADDR (src/mesh/gloo_address.h).
  std::string gloo_hostname;
  // Why that address (filled by init_process_group, quoted by connection errors).
  std::string gloo_address_reason;
  // "auto": shared memory for groups on one host, Gloo otherwise; "gloo": Gloo for every group; "shm":
  // shared memory, and an error for a group that spans hosts. Empty: DTENSOR_BACKEND, else "auto".
  std::string backend;
  // When set, every group's backend is make_backend(group rank, group size), connecting no peers and using
  // no store (c10d's Backend.register_backend, for a world whose other ranks do not exist: the dry run's
  // fake world, dtensor/plan/fake_world.h). `backend` is then ignored.
  std::function<c10::intrusive_ptr<c10d::Backend>(int group_rank, int group_size)> make_backend;
  // CUDA tensors: "nccl" (ProcessGroupNCCL, one GPU per rank) or "gloo" (copied to the host and back through
  // the group's CPU backend: for ranks that share one GPU, which NCCL refuses). Empty: DTENSOR_CUDA_BACKEND,
  // else "nccl". Only consulted when a collective meets a CUDA tensor.
  std::string cuda_backend;
};

// The job as seen from one rank: its store, rank and size, and the process groups created so far (one per
// distinct list of global ranks; creating a group is collective over its members).
class World {
 public:
  World(c10::intrusive_ptr<c10d::Store> store, int rank, int size, InitOptions options);
  ~World();

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }

  // The group over `global_ranks` (this rank must be a member). The first request for a rank list creates
  // its backend, which every member must do too, in the same order relative to its other group creations; it
  // returns on no member before every member has built its side (a store barrier), so a member may use and drop
  // the group at once.
  std::shared_ptr<ProcessGroup> group(const std::vector<int>& global_ranks);
  std::shared_ptr<ProcessGroup> world_group();

 private:
  struct Groups;
  c10::intrusive_ptr<c10d::Backend> connect_gloo(const c10::intrusive_ptr<c10d::Store>& group_store, int group_rank,
                                                 int group_size);
  c10::intrusive_ptr<c10d::Backend> with_shared_memory(c10::intrusive_ptr<c10d::Backend> gloo,
                                                       c10d::Store& group_store, const std::vector<int>& global_ranks,
                                                       int group_rank);
  ProcessGroup::BackendFactory cuda_backend_factory(c10::intrusive_ptr<c10d::Backend> cpu,
                                                   const std::vector<int>& global_ranks, int group_rank);
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  InitOptions options_;
  std::unique_ptr<Groups> groups_;
};


// Initialises the calling thread's (and, if none is set yet, the process's) default world from the launcher's
// environment (LaunchEnv): rank 0 serves a TCPStore on MASTER_ADDR:MASTER_PORT, all ranks connect to it and
// build the world group. Fails with a clear error on bad env, a busy port or a peer that never arrives.
// Both overloads ignore SIGPIPE where its disposition is still the default (as CPython does at start-up): a write to
// a dead peer's socket is then an error the collective names, never a silent death by signal (status 141).
std::shared_ptr<World> init_process_group(InitOptions options = {});
// Same over a store the caller made (a c10d::HashStore shared by threads in one process, for tests).
std::shared_ptr<World> init_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                          InitOptions options = {});
// The calling thread's world, else the process's; throws if init_process_group was not called.
std::shared_ptr<World> current_world();
bool is_initialized();
// Forgets the calling thread's world (and the process's if it is the same). Tearing down the last reference
// to a world is bounded by its timeout: past it, the teardown is abandoned (left to the OS) with a message.
// The same bounded teardown runs at exit for a world never destroyed; if it overruns there, the process
// ends at once with _exit(1) after saying why.
void destroy_process_group();

}  // namespace dtensor
