#include "checkpoint/agreement.h"

#include <ATen/ATen.h>

#include <cstring>

#include "dtensor/core/error.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/mesh/process_group.h"

namespace dtensor::checkpoint::detail {

std::shared_ptr<ProcessGroup> checkpoint_group() {
  if (!is_initialized()) return nullptr;
  return current_world()->world_group();
}

int group_rank(const ProcessGroup* group) { return group == nullptr ? 0 : group->rank(); }
int group_size(const ProcessGroup* group) { return group == nullptr ? 1 : group->size(); }

std::vector<std::string> all_gather_strings(ProcessGroup* group, const std::string& mine) {
  if (group == nullptr || group->size() == 1) return {mine};
  at::Tensor bytes = at::empty({static_cast<int64_t>(mine.size())}, at::kByte);
  if (!mine.empty()) std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  const std::vector<int64_t> sizes = exchange_sizes(bytes.numel(), *group);
  const at::Tensor all = all_gather(bytes, 0, *group, sizes).contiguous();
  std::vector<std::string> out;
  const char* p = static_cast<const char*>(all.data_ptr());
  for (int64_t s : sizes) {
    out.emplace_back(p, static_cast<size_t>(s));
    p += s;
  }
  return out;
}

void agree_or_throw(ProcessGroup* group, const std::string& local_error) {
  const std::vector<std::string> errors = all_gather_strings(group, local_error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    if (errors.size() == 1) throw Error(errors[r]);
    throw DTENSOR_ERROR(errors[r], " (found by rank ", r, ")");
  }
}

}  // namespace dtensor::checkpoint::detail
