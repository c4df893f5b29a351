#include "mesh/shm/shm_comm.h"

#include <algorithm>
#include <cstring>

#include "dtensor/core/error.h"
#include "dtensor/core/chunking.h"
#include "mesh/shm/peer_wait.h"
#include "mesh/shm/stream_copy.h"
#include "mesh/size_agreement.h"

namespace dtensor::detail::shm {
namespace {

constexpr int64_t kOneShotBytes = 32 << 10;

char* bytes_of(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }
int64_t nbytes(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

struct ShmComm::Call {
  const char* collective;
  const std::vector<int64_t>& descriptor;
  std::chrono::steady_clock::time_point deadline{};
  bool first = true;
};

ShmComm::ShmComm(Segment segment, int rank, std::vector<int> global_ranks, std::string group_text,
                 std::chrono::milliseconds timeout)
    : segment_(std::move(segment)), rank_(rank), size_(static_cast<int>(global_ranks.size())),
      global_ranks_(std::move(global_ranks)), group_text_(std::move(group_text)), timeout_(timeout) {}

void ShmComm::begin(Call& call) {
  DTENSOR_CHECK(broken_.empty(), "dtensor: ", call.collective, " on ", group_text_,
                ": the group's shared memory is unusable after an earlier failure (", broken_, ")");
  call.deadline = std::chrono::steady_clock::now() + timeout_;
}

void ShmComm::fail(Call& call, const std::string& why) {
  segment_.control(rank_).failed.store(1);
  broken_ = std::string(call.collective) + ": " + why;
  throw DTENSOR_ERROR("dtensor: ", call.collective, " on ", group_text_, ": ", why);
}

void ShmComm::sync(Call& call) {
  RankControl& me = segment_.control(rank_);
  if (call.first) {
    std::memcpy(me.descriptor[parity()], call.descriptor.data(), call.descriptor.size() * sizeof(int64_t));
  }
  ++arrived_;
  publish_arrival(me, arrived_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    const RankControl& peer = segment_.control(r);
    WaitFailure failure = wait_for_arrival(peer, arrived_, call.deadline);
    if (failure == WaitFailure::NONE) continue;
    std::string who = "rank " + std::to_string(global_ranks_[r]) + " (group rank " + std::to_string(r) + ", pid " +
                      std::to_string(peer.pid.load()) + ")";
    switch (failure) {
      case WaitFailure::TIMED_OUT:
        fail(call, who + " did not arrive within " + std::to_string(timeout_.count()) + " ms");
      case WaitFailure::PEER_EXITED: fail(call, who + " exited during the collective");
      case WaitFailure::PEER_FAILED: fail(call, who + " gave up on the group after a failure of its own");
      case WaitFailure::NONE: break;
    }
  }
  if (call.first) {
    call.first = false;
    std::vector<const int64_t*> rows(size_);
    for (int r = 0; r < size_; ++r) rows[r] = segment_.control(r).descriptor[parity()];
    check_descriptors(std::string(call.collective) + " on " + group_text_, global_ranks_, rows);
  }
}

void ShmComm::all_reduce(const at::Tensor& tensor, Reduction op, const std::vector<int64_t>& descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  Call call{"all_reduce", descriptor};
  begin(call);
  const int64_t es = tensor.element_size(), numel = tensor.numel();
  const auto dtype = tensor.scalar_type();
  char* data = bytes_of(tensor);
  std::vector<const void*> srcs(size_);
  const int64_t per_epoch = segment_.chunk_bytes() / es;
  const bool streaming = numel * es >= streaming_bytes();
  if (numel * es <= kOneShotBytes || size_ == 2) {
    // One shot per chunk: every rank reduces the whole chunk from all buffers straight into its tensor (same
    // order, same bits everywhere). For two ranks this is also the large-message path: against the two-shot
    // split below it reads each chunk twice instead of three times and needs one barrier, not two, and the
    // extra arithmetic (a whole chunk, not half) is cheaper than that pass (comm_bench, 2026-11-23).
    for (int64_t off = 0; call.first || off < numel; off += per_epoch) {
      const int64_t m = std::min(per_epoch, numel - off);
      std::memcpy(mine(), data + off * es, m * es);
      sync(call);
      for (int r = 0; r < size_; ++r) srcs[r] = theirs(r);
      reduce_into(data + off * es, srcs.data(), size_, m, dtype, op, streaming);
      next_epoch();
    }
    return;
  }
  // Two shots per chunk: reduce-scatter (rank r reduces slice r into its own buffer), then all-gather.
  for (int64_t off = 0; off < numel; off += per_epoch) {
    const int64_t m = std::min(per_epoch, numel - off);
    std::memcpy(mine(), data + off * es, m * es);
    sync(call);
    const std::vector<int64_t> slices = chunk_sizes(m, size_);
    const int64_t lo = chunk_offset(slices, rank_);
    for (int r = 0; r < size_; ++r) srcs[r] = theirs(r) + lo * es;
    reduce_into(mine() + lo * es, srcs.data(), size_, slices[rank_], dtype, op);
    sync(call);
    for (int r = 0; r < size_; ++r) {
      const int64_t lo_r = chunk_offset(slices, r);
      copy_bytes(data + (off + lo_r) * es, theirs(r) + lo_r * es, slices[r] * es, streaming);
    }
    next_epoch();
  }
}

void ShmComm::all_gather(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  Call call{"all_gather", descriptor};
  begin(call);
  const int64_t n = nbytes(in), chunk = segment_.chunk_bytes();
  const bool streaming = nbytes(out) >= streaming_bytes();
  for (int64_t off = 0; call.first || off < n; off += chunk) {
    const int64_t m = std::min(chunk, n - off);
    std::memcpy(mine(), bytes_of(in) + off, m);
    sync(call);
    for (int r = 0; r < size_; ++r) copy_bytes(bytes_of(out) + r * n + off, theirs(r), m, streaming);
    next_epoch();
  }
}

void ShmComm::reduce_scatter(const at::Tensor& out, const at::Tensor& in, Reduction op,
                             const std::vector<int64_t>& descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  Call call{"reduce_scatter", descriptor};
  begin(call);
  const int64_t es = in.element_size(), n = out.numel();
  const bool consistent = in.numel() == n * size_;  // else the size check below fails on every rank
  const int64_t per_epoch = segment_.chunk_bytes() / (size_ * es);
  const bool streaming = nbytes(out) >= streaming_bytes();
  std::vector<const void*> srcs(size_);
  for (int64_t off = 0; call.first || off < n; off += per_epoch) {
    const int64_t m = std::max<int64_t>(0, std::min(per_epoch, n - off));
    // This rank's buffer: [block 0 piece | block 1 piece | ...], each m elements.
    for (int k = 0; k < size_ && consistent; ++k) {
      std::memcpy(mine() + k * m * es, bytes_of(in) + (k * n + off) * es, m * es);
    }
    sync(call);
    for (int r = 0; r < size_; ++r) srcs[r] = theirs(r) + rank_ * m * es;
    reduce_into(bytes_of(out) + off * es, srcs.data(), size_, m, out.scalar_type(), op, streaming);
    next_epoch();
  }
}

void ShmComm::all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                         const std::vector<int64_t>& in_splits, const std::vector<int64_t>& descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  Call call{"all_to_all", descriptor};
  begin(call);
  int64_t row_bytes = in.element_size();
  for (int64_t d = 1; d < in.dim(); ++d) row_bytes *= in.size(d);
  // Byte ranges per peer, from the splits (rows of dim 0).
  std::vector<int64_t> send_off(size_), send_len(size_), recv_off(size_), recv_len(size_);
  for (int64_t r = 0, s = 0, q = 0; r < size_; ++r) {
    send_off[r] = s, send_len[r] = in_splits[r] * row_bytes, s += send_len[r];
    recv_off[r] = q, recv_len[r] = out_splits[r] * row_bytes, q += recv_len[r];
  }
  // Each buffer holds one sub-buffer of `quota` bytes per destination.
  const int64_t quota = segment_.chunk_bytes() / size_ / 64 * 64;
  const bool streaming = nbytes(out) >= streaming_bytes();
  int64_t epochs = 1;  // known after the first barrier, from everyone's descriptors
  for (int64_t t = 0; t < epochs; ++t) {
    for (int r = 0; r < size_; ++r) {
      const int64_t len = std::clamp<int64_t>(send_len[r] - t * quota, 0, quota);
      std::memcpy(mine() + r * quota, bytes_of(in) + send_off[r] + t * quota, len);
    }
    const bool first = call.first;
    sync(call);
    if (first) {
      int64_t largest = 0;
      for (int j = 0; j < size_; ++j) {
        for (int r = 0; r < size_; ++r) {
          largest = std::max(largest, segment_.control(j).descriptor[parity()][kDescriptorSplitsAt + r] * row_bytes);
        }
      }
      epochs = std::max<int64_t>(1, (largest + quota - 1) / quota);
    }
    for (int j = 0; j < size_; ++j) {
      const int64_t len = std::clamp<int64_t>(recv_len[j] - t * quota, 0, quota);
      copy_bytes(bytes_of(out) + recv_off[j] + t * quota, theirs(j) + rank_ * quota, len, streaming);
    }
    next_epoch();
  }
}

void ShmComm::broadcast(const at::Tensor& tensor, int root, const std::vector<int64_t>& descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  Call call{"broadcast", descriptor};
  begin(call);
  const int64_t n = nbytes(tensor), chunk = segment_.chunk_bytes();
  for (int64_t off = 0; call.first || off < n; off += chunk) {
    const int64_t m = std::min(chunk, n - off);
    if (rank_ == root) std::memcpy(mine(), bytes_of(tensor) + off, m);
    sync(call);
    if (rank_ != root) copy_bytes(bytes_of(tensor) + off, theirs(root), m, n >= streaming_bytes());
    next_epoch();
  }
}

void ShmComm::agree(const char* collective, const std::vector<int64_t>& descriptor) {
  std::lock_guard<std::mutex> lock(mutex_);
  Call call{collective, descriptor};
  begin(call);
  sync(call);
  next_epoch();
}

}  // namespace dtensor::detail::shm
