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

// For the error of a failed collective: what became of each other member, "rank 1: exited (pid 4242, this
// host); rank 3: running (pid 4250, this host); rank 5: on host node7 (not checkable from here)". Members on
// this host are looked up by pid (process_state.h); a member that never published is "unknown". Store reads
// only: the caller bounds the time (the store's server, rank 0, may be the member that died).
std::string describe_members(c10d::Store& store, const std::vector<int>& global_ranks, int my_global_rank);

}  // namespace dtensor::detail
