#include "mesh/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "dtensor/core/error.h"

namespace dtensor::detail::shm {
namespace {

constexpr uint64_t kMagic = 0x64746e73686d3031ULL;  // "dtnshm01"

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

size_t control_offset() { return round_up(sizeof(Header), 64); }
size_t data_offset(int ranks) { return round_up(control_offset() + sizeof(RankControl) * ranks, 4096); }

std::string errno_text() { return std::strerror(errno); }

std::string bytes_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

}  // namespace

int64_t chunk_bytes_from_environ() {
  static const int64_t bytes = [] {
    const char* v = std::getenv("DTENSOR_SHM_CHUNK_BYTES");
    int64_t b = v ? std::atoll(v) : 0;
    if (b <= 0) b = int64_t(1) << 20;
    b = std::max<int64_t>(b, int64_t(64) << 10);
    return b / 4096 * 4096;
  }();
  return bytes;
}

Segment::Segment(Segment&& other) noexcept { *this = std::move(other); }

Segment& Segment::operator=(Segment&& other) noexcept {
  if (this != &other) {
    if (base_) munmap(base_, bytes_);
    base_ = other.base_;
    bytes_ = other.bytes_;
    ranks_ = other.ranks_;
    chunk_bytes_ = other.chunk_bytes_;
    name_ = std::move(other.name_);
    other.base_ = nullptr;
  }
  return *this;
}

Segment::~Segment() {
  if (base_) munmap(base_, bytes_);
}

RankControl& Segment::control(int rank) const {
  return reinterpret_cast<RankControl*>(static_cast<char*>(base_) + control_offset())[rank];
}

char* Segment::buffer(int rank, int parity) const {
  return static_cast<char*>(base_) + data_offset(ranks_) + (static_cast<size_t>(rank) * 2 + parity) * chunk_bytes_;
}

Segment Segment::open_for_group(c10d::Store& store, int group_rank, int group_size, const std::string& group_tag,
                                int64_t chunk_bytes, std::chrono::milliseconds timeout) {
  Segment s;
  s.ranks_ = group_size;
  s.chunk_bytes_ = chunk_bytes;
  s.bytes_ = data_offset(group_size) + static_cast<size_t>(group_size) * 2 * chunk_bytes;
  const bool creator = group_rank == 0;
  int fd = -1;
  if (creator) {
    // Anonymous from birth: nothing in /dev/shm, whatever happens to the job from here on.
    fd = static_cast<int>(memfd_create(("dtensor-g" + group_tag).c_str(), MFD_CLOEXEC));
    DTENSOR_CHECK(fd >= 0, "dtensor: cannot create shared memory for group ", group_tag, ": ", errno_text());
    s.name_ = "/proc/" + std::to_string(getpid()) + "/fd/" + std::to_string(fd);
    if (ftruncate(fd, static_cast<off_t>(s.bytes_)) != 0) {
      std::string why = errno_text();
      close(fd);
      throw DTENSOR_ERROR("dtensor: cannot size shared memory for group ", group_tag, " to ", s.bytes_,
                          " bytes: ", why);
    }
  } else {
    s.name_ = bytes_of(store.get("shm/name"));  // bounded by the store's timeout
    fd = open(s.name_.c_str(), O_RDWR | O_CLOEXEC);
    DTENSOR_CHECK(fd >= 0, "dtensor: cannot open group ", group_tag, "'s shared memory ", s.name_,
                  " (rank 0's; did it exit?): ", errno_text());
  }
  void* base = mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  if (!creator) close(fd);
  if (base == MAP_FAILED) {
    if (creator) close(fd);
    errno = map_errno;
    throw DTENSOR_ERROR("dtensor: cannot map shared memory ", s.name_, ": ", errno_text());
  }
  s.base_ = base;
  if (creator) {
    auto* header = static_cast<Header*>(base);
    header->ranks = group_size;
    header->chunk_bytes = chunk_bytes;
    header->magic = kMagic;
    store.set("shm/name", std::vector<uint8_t>(s.name_.begin(), s.name_.end()));
  }
  s.control(group_rank).pid.store(static_cast<int32_t>(getpid()));
  // Everyone has mapped it (and written its pid) once the count reaches the group size; then rank 0 closes
  // its descriptor, and the memory lives only in the members' mappings.
  store.add("shm/mapped", 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store.add("shm/mapped", 0) < group_size) {
    if (std::chrono::steady_clock::now() > deadline) {
      if (creator) close(fd);
      throw DTENSOR_ERROR("dtensor: not every member of group ", group_tag, " mapped shared memory ", s.name_,
                          " within ", timeout.count(), " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (creator) close(fd);
  DTENSOR_CHECK(static_cast<Header*>(base)->magic == kMagic, "dtensor: shared memory ", s.name_, " is not ours");
  return s;
}

}  // namespace dtensor::detail::shm
