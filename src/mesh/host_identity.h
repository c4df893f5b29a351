// Which host a rank runs on, as the store sees it: its hostname plus the kernel's boot id
// (/proc/sys/kernel/random/boot_id), so two containers or machines that share a hostname, or a machine
// that rebooted, never count as one host. A group whose members all report the same identity can use
// shared memory between them.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace dtensor::detail {

std::string host_identity();  // "hostname boot-id"

// Publishes this rank's identity on the job's store (once per World).
void publish_host_identity(c10d::Store& store, int global_rank);
// True when every member published the same identity (waits for them, bounded by the store's timeout).
bool members_share_host(c10d::Store& store, const std::vector<int>& global_ranks);

}  // namespace dtensor::detail
