#include "dtensor/mesh/comm_hooks.h"

#include <utility>

namespace dtensor {
namespace {
// Per thread: thread-per-rank tests keep their accounting apart. A slot is cleared, not erased, so that
// guards may die in any order.
thread_local std::vector<CommObserver> observers;
thread_local int uncounted_depth = 0;
thread_local std::string comm_scope;
}  // namespace

const std::string& current_comm_scope() { return comm_scope; }
CommScopeGuard::CommScopeGuard(std::string scope) : previous_(std::exchange(comm_scope, std::move(scope))) {}
CommScopeGuard::~CommScopeGuard() { comm_scope = std::move(previous_); }

CommObserverGuard::CommObserverGuard(CommObserver observer) : slot_(observers.size()) {
  observers.push_back(std::move(observer));
}

CommObserverGuard::~CommObserverGuard() {
  observers[slot_] = nullptr;
  while (!observers.empty() && !observers.back()) observers.pop_back();
}

namespace detail {
UncountedCollectivesGuard::UncountedCollectivesGuard() { ++uncounted_depth; }
UncountedCollectivesGuard::~UncountedCollectivesGuard() { --uncounted_depth; }

void notify_comm_observers(const CommEvent& event) {
  if (uncounted_depth > 0) return;
  for (const auto& observer : observers) {
    if (observer) observer(event);
  }
}
}  // namespace detail

}  // namespace dtensor
