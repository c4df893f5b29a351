// How the ranks of a checkpoint save or load agree: every rank learns every rank's string (file records,
// errors), and an error on any rank becomes the same error on every rank, before anything irreversible.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace dtensor {
class ProcessGroup;
}

namespace dtensor::checkpoint::detail {

// The group a checkpoint runs over: the calling thread's world group, or nullptr when no process group was
// initialized (one process alone).
std::shared_ptr<ProcessGroup> checkpoint_group();
int group_rank(const ProcessGroup* group);
int group_size(const ProcessGroup* group);

// Every rank's `mine`, in group rank order (one all_gather of sizes, one of bytes).
std::vector<std::string> all_gather_strings(ProcessGroup* group, const std::string& mine);

// Each rank passes its error ("" if none). If any rank has one, every rank throws the same dtensor::Error:
// the lowest failing rank's message (with " (found by rank r)" in a group of more than one rank).
void agree_or_throw(ProcessGroup* group, const std::string& local_error);

}  // namespace dtensor::checkpoint::detail
