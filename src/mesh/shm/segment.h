// One POSIX shared-memory segment per process group of ranks on one host, and its layout.
//
// Naming and lifetime: the group's rank 0 creates the segment with memfd_create, so it never has a name in
// /dev/shm, and publishes "/proc/<its pid>/fd/<fd>" under the group's store prefix; every member opens that
// path (a fresh descriptor on the same memory; same user, same host), maps it and counts itself on the
// store, and once all members have mapped it rank 0 closes its descriptor. The memory then lives only in
// the members' mappings and goes with the last of them: a job killed at any point, group creation included,
// leaves nothing behind, and two jobs on one host (whatever their MASTER_PORT) never meet, since the path
// names the creating process. If rank 0 dies before a member opened the path, that member fails with an
// error naming it. Threads-as-ranks open it too (the path works within one process).
//
// Layout: [Header][RankControl x n][data: n ranks x 2 buffers x chunk_bytes]. Each rank writes only its own
// control block and its own buffers; everyone reads everyone's. The two buffers alternate per write epoch
// (see shm_comm.h for why two are enough).
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace dtensor::detail::shm {

constexpr int kMaxRanks = 64;             // larger groups stay on Gloo
constexpr int64_t kDescriptorInts = 11 + 2 * kMaxRanks;  // size_agreement's descriptor, any group size

// One rank's control block. `arrived` (the futex word) and `sleepers` sit on their own cache lines so a
// rank spinning on a peer's counter does not bounce the line its peer writes for other reasons.
struct alignas(64) RankControl {
  std::atomic<uint32_t> arrived;   // barriers this rank has reached
  char pad0[60];
  std::atomic<uint32_t> sleepers;  // peers blocked in futex_wait on `arrived`
  std::atomic<int32_t> failed;     // nonzero once this rank gave up on the group (peers fail fast)
  std::atomic<int32_t> pid;        // for liveness checks
  char pad1[52];
  int64_t descriptor[2][kDescriptorInts];  // the collective's sizes, per buffer parity (in-band size check)
};

struct Header {
  uint64_t magic;
  int64_t ranks;
  int64_t chunk_bytes;
};

class Segment {
 public:
  Segment() = default;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  ~Segment();

  // Collective over the group's members: create/open/map as described above. `store` is the group's
  // prefixed store. Throws dtensor::Error when a member does not map it within `timeout`.
  static Segment open_for_group(c10d::Store& store, int group_rank, int group_size, const std::string& group_tag,
                                int64_t chunk_bytes, std::chrono::milliseconds timeout);

  RankControl& control(int rank) const;
  char* buffer(int rank, int parity) const;
  int64_t chunk_bytes() const { return chunk_bytes_; }
  const std::string& name() const { return name_; }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int ranks_ = 0;
  int64_t chunk_bytes_ = 0;
  std::string name_;
};

// Bytes each rank's buffer holds: DTENSOR_SHM_CHUNK_BYTES, else 1 MiB (a multiple of 4 KiB, at least 64 KiB).
int64_t chunk_bytes_from_environ();

}  // namespace dtensor::detail::shm
