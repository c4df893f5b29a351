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

std::vector<Member> read_members(c10d::Store& store, const std::vector<int>& global_ranks) {
  std::vector<Member> members;
  members.reserve(global_ranks.size());
  for (int r : global_ranks) {
    Member m;
    m.global_rank = r;
    if (store.check({key_of(r)})) {
      Published p = parse(store.get(key_of(r)));
      m.identity = std::move(p.identity);
      m.pid = p.pid;
    }
    members.push_back(std::move(m));
  }
  return members;
}

std::string describe_members(const std::vector<Member>& members, int my_global_rank) {
  const std::string here = host_identity();
  std::string out;
  for (const Member& m : members) {
    if (m.global_rank == my_global_rank) continue;
    if (!out.empty()) out += "; ";
    out += "rank " + std::to_string(m.global_rank) + ": ";
    if (m.identity.empty()) {
      out += "unknown (it never published its host)";
    } else if (m.identity != here || m.pid <= 0) {
      out += "on host " + m.identity.substr(0, m.identity.find(' ')) + " (not checkable from here)";
    } else {
      out += std::string(describe(process_state(m.pid))) + " (pid " + std::to_string(m.pid) + ", this host)";
    }
  }
  return out;
}

}  // namespace dtensor::detail
