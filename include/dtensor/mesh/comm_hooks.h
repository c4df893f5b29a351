// Every collective issued through a dtensor ProcessGroup passes through here before it runs: the hook
// point for comm accounting (CommDebugMode, benchmarks, the plan dry run).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtensor {

struct CommEvent {
  const char* collective;     // "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", ...
  int64_t bytes;              // bytes this rank sends into the collective (its input)
  int group_size;
  const std::vector<int>* group_ranks;  // global ranks of the group
  bool async_op = false;      // issued to be waited on later (a prefetch, an overlapped collective)
};

using CommObserver = std::function<void(const CommEvent&)>;

// Registers `observer` for collectives issued by the calling thread until the returned guard dies.
// Observers nest; each sees every event.
class CommObserverGuard {
 public:
  explicit CommObserverGuard(CommObserver observer);
  ~CommObserverGuard();
  CommObserverGuard(const CommObserverGuard&) = delete;
  CommObserverGuard& operator=(const CommObserverGuard&) = delete;

 private:
  size_t slot_;
};

// What issued a collective, for accounting by module (CommDebugMode, the plan dry run): the path of the
// innermost hooked module whose forward is running (module_hooks.h sets it), and, in backward, the path
// its forward ran under: a differentiable collective (autograd_collectives.h) records the scope in forward
// and restores it while its backward runs. "" outside any recorded module.
const std::string& current_comm_scope();

// Sets the calling thread's comm scope until it dies.
class CommScopeGuard {
 public:
  explicit CommScopeGuard(std::string scope);
  ~CommScopeGuard();
  CommScopeGuard(const CommScopeGuard&) = delete;
  CommScopeGuard& operator=(const CommScopeGuard&) = delete;

 private:
  std::string previous_;
};

namespace detail {
void notify_comm_observers(const CommEvent& event);

// While alive on this thread, collectives are not reported to observers: the library's own metadata
// exchanges (the global shape of an op's output learnt once per decision) are not what a plan moves.
class UncountedCollectivesGuard {
 public:
  UncountedCollectivesGuard();
  ~UncountedCollectivesGuard();
  UncountedCollectivesGuard(const UncountedCollectivesGuard&) = delete;
  UncountedCollectivesGuard& operator=(const UncountedCollectivesGuard&) = delete;
};
}  // namespace detail

}  // namespace dtensor
