// Collectives between the ranks of one host through one shared segment (segment.h).
//
// Epochs: every collective is a sequence of write epochs. In epoch e each rank writes (at most chunk_bytes)
// into its own buffer of parity e % 2, then all ranks meet at a barrier (each bumps its `arrived` counter
// and waits for everyone's), then they read each other's buffers. Two buffers suffice: a rank writes
// parity p again in epoch e + 2 only after passing epoch e + 1's barrier, which every peer reaches only once
// it has finished reading epoch e. Large messages stream through in as many epochs as they need; nothing is
// allocated per call.
//
// In-band size check: the first epoch of every collective also publishes the caller's size descriptor
// (size_agreement.h) beside the data, and right after that epoch's barrier every rank compares all
// descriptors and throws the same mismatch error before reading a byte, so ranks stay in step.
//
// Algorithms (n ranks, placement algebra of the callers: Partial -> Replicate = all_reduce, etc.):
//   all_reduce, small (<= 32 KiB): one epoch; every rank reduces all n buffers itself (one barrier).
//   all_reduce, large: per chunk, reduce-scatter then all-gather through the buffers: rank r reduces the
//     r-th slice of the chunk from all buffers into its own buffer (barrier), then everyone copies every
//     reduced slice out (two barriers per chunk; each byte is reduced once, by one rank).
//   all_gather: per chunk, every rank copies every buffer's piece to its place in the output.
//   reduce_scatter: per chunk, rank r's buffer holds slice k of each output block; rank r reduces block r.
//   all_to_all: per chunk, a rank's buffer holds one sub-buffer per destination.
//   broadcast: per chunk, the root writes, the others copy.   barrier: one epoch with no data.
// Each call runs to completion on the calling thread (the backend decides which thread: issue_queue.h).
//
// Failures: waits are bounded by the group's timeout and name the collective and the peer; a rank that
// fails marks itself failed in the segment, so its peers fail fast, and the group refuses further use.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "mesh/shm/reduce_kernels.h"
#include "mesh/shm/segment.h"

namespace dtensor::detail::shm {

class ShmComm {
 public:
  // `global_ranks` in group-rank order; `group_text` is ProcessGroup::describe()'s "group [0, 1] (rank 0 of 2)".
  ShmComm(Segment segment, int rank, std::vector<int> global_ranks, std::string group_text,
          std::chrono::milliseconds timeout);

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // `descriptor` is size_agreement's descriptor of this rank's call (length descriptor_length(size())).
  void all_reduce(const at::Tensor& tensor, Reduction op, const std::vector<int64_t>& descriptor);
  void all_gather(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& descriptor);
  void reduce_scatter(const at::Tensor& out, const at::Tensor& in, Reduction op,
                      const std::vector<int64_t>& descriptor);
  void all_to_all(const at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& out_splits,
                  const std::vector<int64_t>& in_splits, const std::vector<int64_t>& descriptor);
  void broadcast(const at::Tensor& tensor, int root, const std::vector<int64_t>& descriptor);
  // Only the descriptor epoch: barrier, and the size check before a call that another backend carries.
  void agree(const char* collective, const std::vector<int64_t>& descriptor);
  // True once a collective failed on a peer (not on a size mismatch, after which the group is still whole).
  bool broken() const { return !broken_.empty(); }

 private:
  struct Call;  // one collective in progress: its name, deadline, first-epoch flag
  char* mine() const { return segment_.buffer(rank_, parity()); }
  char* theirs(int r) const { return segment_.buffer(r, parity()); }
  int parity() const { return static_cast<int>(epoch_ & 1); }
  void begin(Call& call);
  void sync(Call& call);            // barrier; after the first one of a call, the size check
  void next_epoch() { ++epoch_; }
  [[noreturn]] void fail(Call& call, const std::string& why);

  Segment segment_;
  int rank_;
  int size_;
  std::vector<int> global_ranks_;
  std::string group_text_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // one collective at a time per group
  uint64_t epoch_ = 0;
  uint32_t arrived_ = 0;
  std::string broken_;  // set once a collective failed: the group cannot be trusted any more
};

}  // namespace dtensor::detail::shm
