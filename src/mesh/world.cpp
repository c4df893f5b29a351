// World (the job's store, its options, and the groups made from it: Gloo connect, same-host shared memory,
// the CUDA backend's factory) and init_process_group / destroy_process_group. This is the only translation
// unit that includes ProcessGroupGloo.hpp (and with it gloo's headers).
#include "dtensor/mesh/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <map>
#include <csignal>
#include <mutex>
#include <stdexcept>

#include "dtensor/core/error.h"
#include "dtensor/mesh/launch_env.h"
#include "dtensor/mesh/fatal_signals.h"
#include "mesh/cuda_support.h"
#include "mesh/deadline.h"
#include "mesh/group_markers.h"
#include "mesh/group_text.h"
#include "mesh/heartbeat.h"
#include "mesh/host_identity.h"
#include "mesh/host_staged_backend.h"
#include "mesh/rendezvous.h"
#include "mesh/gloo_address.h"
#include "mesh/shm/shm_backend.h"

namespace dtensor {
using detail::absent_members;
using detail::built_key;
using detail::describe_group;
using detail::joined_key;
using detail::join;
using detail::message_of;

namespace {

// For a failed connection: the address this rank's Gloo bound, why, and the cure.
std::string gloo_address_note(const InitOptions& o) {
  if (o.backend == "shm") return "";
  const std::string address = o.gloo_hostname.empty() ? "Gloo's default device" : o.gloo_hostname;
  return "; this rank's Gloo address: " + address + (o.gloo_address_reason.empty() ? "" : " (" + o.gloo_address_reason + ")") +
         "; if the other hosts cannot reach it, set GLOO_SOCKET_IFNAME to the interface that reaches them";
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
  if (std::find(allowed.begin(), allowed.end(), mode) == allowed.end()) {
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i) {
      list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
    }
    throw DTENSOR_ERROR("dtensor: ", from, "=", mode, " is not ", what, " (", list, ")");
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

// ---------------------------------------------------------------------------------------------------- World

namespace {
std::atomic<int64_t> real_worlds{0};
}  // namespace

int64_t detail::real_worlds_created() { return real_worlds.load(); }

struct World::Groups {
  std::mutex mutex;
  std::map<std::vector<int>, std::shared_ptr<ProcessGroup>> by_ranks;
};

World::World(c10::intrusive_ptr<c10d::Store> store, int rank, int size, InitOptions options)
    : store_(std::move(store)), rank_(rank), size_(size), options_(std::move(options)),
      groups_(std::make_unique<Groups>()) {
  options_.timeout = resolve_timeout(options_.timeout);
  if (!options_.make_backend) options_.backend = resolve_backend(options_.backend);
  options_.cuda_backend = resolve_cuda_backend(options_.cuda_backend);
  DTENSOR_CHECK(size >= 1 && rank >= 0 && rank < size, "dtensor: rank ", rank, " is outside [0, world size ",
                size, ")");
  // Also on Gloo: a failed collective's error reports the members by it (describe_members). A world of
  // peerless groups (make_backend: a plan dry run) has no members to describe.
  if (options_.make_backend) return;
  ++real_worlds;
  try {
    detail::publish_host_identity(*store_, rank_);  // one store op: bounded by the store's timeout
  } catch (const std::exception& e) {
    throw DTENSOR_ERROR("dtensor: rank ", rank_, " could not publish its host on the store "
                        "(served by rank 0) within ", options_.timeout.count(), " ms: ", message_of(e));
  }
}

World::~World() = default;

std::shared_ptr<ProcessGroup> World::group(const std::vector<int>& global_ranks) {
  std::set<int> unique(global_ranks.begin(), global_ranks.end());
  DTENSOR_CHECK(unique.size() == global_ranks.size() && !global_ranks.empty() && *unique.begin() >= 0 &&
                    *unique.rbegin() < size_,
                "dtensor: invalid process group ranks [", join(global_ranks, ", "), "] in a world of ", size_);
  std::lock_guard<std::mutex> lock(groups_->mutex);
  auto it = groups_->by_ranks.find(global_ranks);
  if (it != groups_->by_ranks.end()) return it->second;

  int group_rank = -1;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    if (global_ranks[i] == rank_) group_rank = static_cast<int>(i);
  }
  DTENSOR_CHECK(group_rank >= 0, "dtensor: rank ", rank_, " is not a member of group [",
                join(global_ranks, ", "), "]");
  if (options_.make_backend) {  // no peers: nothing to connect
    auto group = std::make_shared<ProcessGroup>(options_.make_backend(group_rank, static_cast<int>(global_ranks.size())),
                                                global_ranks, rank_, options_.timeout, /*peerless=*/true);
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
  auto members = std::make_shared<std::vector<detail::Member>>();
  auto step = std::make_shared<std::atomic<const char*>>("announcing itself on the store");
  const auto bound = options_.timeout + std::chrono::milliseconds(2000);
  const std::string what = "dtensor: rank " + std::to_string(rank_) + " could not connect process group [" +
                           join(global_ranks, ", ") + "] within ";
  bool finished = false;
  const auto started = std::chrono::steady_clock::now();
  try {
    finished = detail::finish_within(bound, [this, slot, members, step, prefixed, global_ranks, group_rank] {
      prefixed->set(joined_key(group_rank), std::vector<uint8_t>{1});
      *step = "connecting Gloo (addresses through the store, then a TCP pair to each member)";
      auto made = connect_gloo(prefixed, group_rank, static_cast<int>(global_ranks.size()));
      *step = "reading the members' hosts and pids";  // all published before joining (World's constructor)
      *members = detail::read_members(*store_, global_ranks);
      if (options_.backend != "gloo" && global_ranks.size() > 1) {
        *step = "setting up shared memory (comparing hosts, mapping the segment)";
        made = with_shared_memory(std::move(made), *prefixed, global_ranks, group_rank);
      }
      // A group exists on no member before it exists on all (PyTorch's store-based barrier after
      // init_process_group): without it a member could return, use and drop its side while a peer still waits
      // inside Gloo's connect for its wake-up, and that peer's connect fails with "closed by peer".
      *step = "waiting for every member to finish building its side of the group";
      prefixed->set(built_key(group_rank), std::vector<uint8_t>{1});
      std::vector<std::string> built;
      for (size_t i = 0; i < global_ranks.size(); ++i) built.push_back(built_key(static_cast<int>(i)));
      prefixed->wait(built, options_.timeout);
      *slot = std::move(made);
    });
  } catch (const std::exception& e) {
    // The time actually waited (a refused connection fails at once), the address Gloo bound and why.
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
    throw DTENSOR_ERROR(what, options_.timeout.count(), " ms: failed after ", waited.count(), " ms while ", step->load(),
                        ": ", absent_members(prefixed, global_ranks, options_.timeout), ": ", message_of(e),
                        gloo_address_note(options_));
  }
  DTENSOR_CHECK(finished, what, bound.count(), " ms: still blocked while ", step->load(),
                " (a member, or the store's server rank 0, froze): ",
                absent_members(prefixed, global_ranks, options_.timeout));
  c10::intrusive_ptr<c10d::Backend> backend = std::move(*slot);
  auto group = std::make_shared<ProcessGroup>(backend, global_ranks, rank_, options_.timeout);
  group->set_cuda_backend_factory(cuda_backend_factory(backend, global_ranks, group_rank));
  group->set_member_diagnosis([members = std::move(*members), rank = rank_] {
    return detail::describe_members(members, rank);
  });
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
    DTENSOR_CHECK(options_.backend != "shm", "dtensor: group [", join(global_ranks, ", "),
                  "] cannot use shared memory (backend shm): ",
                  (one_host ? "more than " + std::to_string(detail::shm::kMaxRanks) + " ranks"
                            : std::string("its ranks run on different hosts")));
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
    DTENSOR_CHECK(cuda, "dtensor: CUDA tensors in group [", join(global_ranks, ", "), "]: ", why);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("dtensor/nccl/" + join(global_ranks, ","), store);
    try {
      return cuda->make_nccl_backend(prefixed, group_rank, static_cast<int>(global_ranks.size()), timeout);
    } catch (const std::exception& e) {
      throw DTENSOR_ERROR("dtensor: rank ", rank, " could not create the NCCL group [", join(global_ranks, ", "),
                          "]: ", message_of(e));
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
  std::cerr << ("dtensor: rank " + std::to_string(rank) + ": shutting down its process groups did not finish within " +
                std::to_string(limit.count()) + " ms (a peer is not answering); leaving them to the OS\n")
            << std::flush;
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

// A write to a socket whose peer died (the store's server, a Gloo peer) must fail with EPIPE, which the collective
// reports naming the peer, not raise SIGPIPE, which ends the process silently (status 141). So SIGPIPE is ignored
// where its disposition is still the default, as CPython does at start-up (which is why c10d and Gloo get EPIPE
// from Python); a handler the program installed stays.
void ignore_sigpipe_if_default() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) != 0) return;
  if ((old.sa_flags & SA_SIGINFO) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
}

std::shared_ptr<World> install(std::shared_ptr<World> world) {
  world->world_group();  // connects every rank: a barrier that proves the job is whole
  thread_world.world = world;
  std::lock_guard<std::mutex> lock(process_world_mutex);
  if (!process_world.world) process_world.world = world;
  return world;
}
}  // namespace

std::shared_ptr<World> init_process_group(InitOptions options) {
  ignore_sigpipe_if_default();
  report_fatal_signals();  // a rank that crashes says where (fatal_signals.h)
  LaunchEnv env = LaunchEnv::from_environ();
  options.timeout = resolve_timeout(options.timeout);
  if (options.gloo_hostname.empty()) {
    if (auto address = detail::gloo_bind_address(env.master_addr, &options.gloo_address_reason)) options.gloo_hostname = *address;
  } else {
    options.gloo_address_reason = "InitOptions::gloo_hostname";
  }
  auto store = detail::connect_store(env, options.timeout);
  // Bounded again from outside: a rank frozen in the middle of a store request can stall c10d's store
  // server for everyone, and store ops then block without their timeout firing (see World::group).
  const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
  const auto bound = options.timeout + std::chrono::milliseconds(2000);
  if (!detail::finish_within(bound, [store, env, timeout = options.timeout, where] {
        detail::wait_for_all_ranks(*store, env.rank, env.world_size, timeout, where);
      })) {
    throw DTENSOR_ERROR("dtensor: rank ", env.rank, " of ", env.world_size, " could not rendezvous at ", where,
                        " within ", bound.count(),
                        " ms: the store (served by rank 0) stopped answering (rank 0, or a rank in the middle of "
                        "a store request, froze?)");
  }
  detail::start_heartbeat(env.rank);  // under tprun: its watchdog sees this rank from now on
  return install(std::make_shared<World>(std::move(store), env.rank, env.world_size, std::move(options)));
}

std::shared_ptr<World> init_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                          InitOptions options) {
  ignore_sigpipe_if_default();
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
