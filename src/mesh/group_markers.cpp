#include "mesh/group_markers.h"

#include <algorithm>
#include <memory>

#include "dtensor/core/error.h"
#include "mesh/deadline.h"
#include "mesh/group_text.h"

namespace dtensor::detail {

std::string joined_key(int group_rank) { return "joined/" + std::to_string(group_rank); }
std::string built_key(int group_rank) { return "built/" + std::to_string(group_rank); }

// Members of `global_ranks` whose key `key_of(i)` is not on the group's store, as global ranks.
namespace {

std::vector<int> missing_keys(c10d::Store& group_store, const std::vector<int>& global_ranks,
                              std::string (*key_of)(int), std::vector<int>* present = nullptr) {
  std::vector<int> absent;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    const bool here = group_store.check({key_of(static_cast<int>(i))});
    if (!here) absent.push_back(global_ranks[i]);
    if (here && present) present->push_back(global_ranks[i]);
  }
  return absent;
}

}  // namespace

std::string absent_members(const c10::intrusive_ptr<c10d::Store>& group_store, const std::vector<int>& global_ranks,
                           std::chrono::milliseconds timeout) {
  auto answer = std::make_shared<std::string>();
  bool answered = false;
  try {
    answered = detail::finish_within(std::min(timeout, std::chrono::milliseconds(2000)), [=] {
      std::vector<int> present;
      const auto absent = missing_keys(*group_store, global_ranks, joined_key, &present);
      const auto unbuilt = missing_keys(*group_store, global_ranks, built_key);
      if (!absent.empty()) {
        *answer = "members [" + join(absent, ", ") + "] never arrived (arrived: [" + join(present, ", ") + "])";
      } else if (!unbuilt.empty()) {
        *answer = "every member arrived (" + join(present, ", ") + "); members [" + join(unbuilt, ", ") +
                  "] never finished building their side, so one died or froze since";
      } else {
        *answer = "every member arrived (" + join(present, ", ") + "), so one died or froze since";
      }
    });
  } catch (const std::exception& e) {
    return "the store (served by rank 0) failed too: " + message_of(e);
  }
  return answered ? *answer : "the store (served by rank 0) did not answer within 2 s: rank 0 died or froze";
}

}  // namespace dtensor::detail
