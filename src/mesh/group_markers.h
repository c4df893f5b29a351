// The markers each member of a group being built writes on the group's store (joined/<r> on arriving, built/<r>
// once its side is built: World::group's last step waits for every member's), and the diagnosis of a failed build
// that they allow: who never arrived, who never finished.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace dtensor::detail {

std::string joined_key(int group_rank);
std::string built_key(int group_rank);

// For an error while building a group: which members never announced themselves, or never finished building their
// side, on the group's store. The store may be what failed (its server, rank 0, dead or frozen), so the question gets
// at most 2 s.
std::string absent_members(const c10::intrusive_ptr<c10d::Store>& group_store, const std::vector<int>& global_ranks,
                           std::chrono::milliseconds timeout);

}  // namespace dtensor::detail
