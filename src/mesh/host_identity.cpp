#include "mesh/host_identity.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <climits>
#include <fstream>

namespace dtensor::detail {
namespace {

std::string key_of(int global_rank) { return "dtensor/host/" + std::to_string(global_rank); }

}  // namespace

std::string host_identity() {
  char name[HOST_NAME_MAX + 1] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return std::string(name) + " " + boot_id;
}

void publish_host_identity(c10d::Store& store, int global_rank) {
  const std::string id = host_identity();
  store.set(key_of(global_rank), std::vector<uint8_t>(id.begin(), id.end()));
}

bool members_share_host(c10d::Store& store, const std::vector<int>& global_ranks) {
  std::vector<uint8_t> first;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    std::vector<uint8_t> id = store.get(key_of(global_ranks[i]));
    if (i == 0) first = std::move(id);
    else if (id != first) return false;
  }
  return true;
}

}  // namespace dtensor::detail
