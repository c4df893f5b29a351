#include "mesh/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <thread>

#include "dtensor/error.h"

namespace dtensor::detail::shm {
namespace {

constexpr uint64_t kMagic = 0x64746e73686d3031ULL;  // "dtnshm01"

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

size_t control_offset() { return round_up(sizeof(Header), 64); }
size_t data_offset(int ranks) { return round_up(control_offset() + sizeof(RankControl) * ranks, 4096); }

std::string random_token() {
  std::random_device device;
  uint64_t v = (static_cast<uint64_t>(device()) << 32) ^ device();
  std::ostringstream os;
  os << std::hex << v;
  return os.str();
}

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
    s.name_ = "/dtensor-" + random_token() + "-g" + group_tag;
    fd = shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) throw dtensor::Error("dtensor: cannot create shared memory " + s.name_ + ": " + errno_text());
    if (ftruncate(fd, static_cast<off_t>(s.bytes_)) != 0) {
      std::string why = errno_text();
      close(fd);
      shm_unlink(s.name_.c_str());
      throw dtensor::Error("dtensor: cannot size shared memory " + s.name_ + " to " + std::to_string(s.bytes_) +
                           " bytes (is /dev/shm large enough?): " + why);
    }
  } else {
    s.name_ = bytes_of(store.get("shm/name"));  // bounded by the store's timeout
    fd = shm_open(s.name_.c_str(), O_RDWR, 0600);
    if (fd < 0) throw dtensor::Error("dtensor: cannot open shared memory " + s.name_ + ": " + errno_text());
  }
  void* base = mmap(nullptr, s.bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    if (creator) shm_unlink(s.name_.c_str());
    throw dtensor::Error("dtensor: cannot map shared memory " + s.name_ + ": " + errno_text());
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
  // Everyone has mapped it (and written its pid) once the count reaches the group size; then the name goes.
  store.add("shm/mapped", 1);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (store.add("shm/mapped", 0) < group_size) {
    if (std::chrono::steady_clock::now() > deadline) {
      if (creator) shm_unlink(s.name_.c_str());
      throw dtensor::Error("dtensor: not every member of group " + group_tag + " mapped shared memory " + s.name_ +
                           " within " + std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (creator) shm_unlink(s.name_.c_str());
  if (static_cast<Header*>(base)->magic != kMagic) throw dtensor::Error("dtensor: shared memory " + s.name_ + " is not ours");
  return s;
}

}  // namespace dtensor::detail::shm
