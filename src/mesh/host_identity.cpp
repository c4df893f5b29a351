#include "mesh/host_identity.h"

#include <unistd.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <climits>
#include <fstream>

#include "mesh/process_state.h"

namespace dtensor::detail {
namespace {

std::string key_of(int global_rank) { return "dtensor/host/" + std::to_string(global_rank); }

// The published value: "<identity>\n<pid>".
struct Published {
  std::string identity;
  int pid = 0;
};

Published parse(const std::vector<uint8_t>& bytes) {
  std::string text(bytes.begin(), bytes.end());
  const auto newline = text.rfind('\n');
  if (newline == std::string::npos) return {text, 0};
  return {text.substr(0, newline), std::atoi(text.c_str() + newline + 1)};
}

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
  const std::string value = host_identity() + "\n" + std::to_string(getpid());
  store.set(key_of(global_rank), std::vector<uint8_t>(value.begin(), value.end()));
}

bool members_share_host(c10d::Store& store, const std::vector<int>& global_ranks) {
  std::string first;
  for (size_t i = 0; i < global_ranks.size(); ++i) {
    std::string id = parse(store.get(key_of(global_ranks[i]))).identity;
    if (i == 0) first = std::move(id);
    else if (id != first) return false;
  }
  return true;
}

std::string describe_members(c10d::Store& store, const std::vector<int>& global_ranks, int my_global_rank) {
  const std::string here = host_identity();
  std::string out;
  for (int r : global_ranks) {
    if (r == my_global_rank) continue;
    if (!out.empty()) out += "; ";
    out += "rank " + std::to_string(r) + ": ";
    if (!store.check({key_of(r)})) {
      out += "unknown (it never published its host)";
      continue;
    }
    const Published p = parse(store.get(key_of(r)));
    if (p.identity != here || p.pid <= 0) {
      out += "on host " + p.identity.substr(0, p.identity.find(' ')) + " (not checkable from here)";
      continue;
    }
    out += std::string(describe(process_state(p.pid))) + " (pid " + std::to_string(p.pid) + ", this host)";
  }
  return out;
}

}  // namespace dtensor::detail
