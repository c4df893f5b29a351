// Which host a rank runs on, as the store sees it: its hostname plus the kernel's boot id
// (/proc/sys/kernel/random/boot_id), so two containers or machines that share a hostname, or a machine
// that rebooted, never count as one host. A group whose members all report the same identity can use
// shared memory between them. Each rank publishes its pid beside it, so that when a collective fails, a rank
// can say what became of each member on its own host.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace dtensor::detail {

std::string host_identity();  // "hostname boot-id"

// Publishes this rank's identity and pid on the job's store (once per World: one store op).
void publish_host_identity(c10d::Store& store, int global_rank);
// True when every member published the same identity (waits for them, bounded by the store's timeout).
bool members_share_host(c10d::Store& store, const std::vector<int>& global_ranks);

// What a member published: its host identity and pid. Read once, when its group is made (every member has
// published by then: a World publishes before it makes any group), so that a failed collective can say what
// became of the members without the store, whose server, rank 0, may be the member that died or that already
// exited after failing too.
struct Member {
  int global_rank = 0;
  std::string identity;  // empty: it never published
  int pid = 0;
};
std::vector<Member> read_members(c10d::Store& store, const std::vector<int>& global_ranks);

// For the error of a failed collective: what became of each other member, "rank 1: exited (pid 4242, this
// host); rank 3: running (pid 4250, this host); rank 5: on host node7 (not checkable from here)". Members on
// this host are looked up by pid (process_state.h); no store and no network.
std::string describe_members(const std::vector<Member>& members, int my_global_rank);

}  // namespace dtensor::detail
