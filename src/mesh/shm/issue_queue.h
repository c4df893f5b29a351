// Where a shared-memory collective runs: inline on the caller's thread, or on the group's worker thread.
//
// Order: every rank must run a group's collectives in the order it issued them (the segment's epochs are
// matched by position). One FIFO worker per group gives that for asynchronous issue; a blocking call runs
// inline only while nothing is queued or running, so it cannot overtake an asynchronous one issued before
// it (if something is queued, the blocking call is queued behind it and its caller waits on the Work).
//
// Why not always the worker: the hand-off (condition-variable wake of the worker, then a wake of the
// waiting caller) costs two futex round trips, tens of µs on a loaded 2-core host, more than the 1 KiB
// all_reduce itself (~4 µs inline). c10d tells us which kind of call it is: the options' asyncOp, which our
// ProcessGroup sets to false for its blocking forms (all_reduce_, all_gather_into, ...), which wait at once.
//
// The worker thread starts on the first asynchronous collective, so a program that only blocks has none.
// Errors: an inline collective throws at issue; a queued one stores its exception in the Work, and
// Work::wait rethrows it. A queued collective is bounded by the group's timeout from when it starts.
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include <torch/csrc/distributed/c10d/Work.hpp>

namespace dtensor::detail::shm {

// A c10d::Work completed by whoever ran the collective.
class ShmWork : public c10d::Work {
 public:
  explicit ShmWork(c10d::OpType type) : c10d::Work(-1, type) {}
  void complete(std::exception_ptr error) { finish(std::move(error)); }
  // The collective bounds itself by the group's timeout from when it starts, and its error names the peer;
  // the caller's `timeout` (the same value, counted from an earlier moment) would cut that short with a
  // bare "timed out". So wait twice that plus a second: the bound only matters for a collective that never
  // started (queued behind one that hung past its own bound).
  bool wait(std::chrono::milliseconds timeout) override {
    return c10d::Work::wait(timeout == ::kNoTimeout ? timeout : 2 * timeout + std::chrono::seconds(1));
  }
};

class IssueQueue {
 public:
  IssueQueue() = default;
  IssueQueue(const IssueQueue&) = delete;
  IssueQueue& operator=(const IssueQueue&) = delete;
  ~IssueQueue();  // runs what is queued (each bounded by the group's timeout), then stops the worker

  // Blocking (async == false): inline when idle, else behind the queue. Async: always queued.
  c10::intrusive_ptr<c10d::Work> issue(c10d::OpType type, bool async, std::function<void()> collective);

  // Runs `fn` inline once everything queued before it has finished (for calls that then use another
  // backend, whose own order must follow ours). Throws if the queue does not drain within `bound`.
  void run_after_queue(const std::function<void()>& fn, std::chrono::milliseconds bound);

 private:
  struct Item {
    std::function<void()> collective;
    c10::intrusive_ptr<ShmWork> work;
  };
  void worker_loop();

  std::mutex mutex_;  // guards the fields below; held by an inline collective while it runs
  std::condition_variable wake_;     // worker: an item arrived, or stop
  std::condition_variable drained_;  // run_after_queue: the queue emptied
  std::deque<Item> queue_;
  bool running_ = false;  // the worker is running an item (it holds no lock then)
  bool stop_ = false;
  uint64_t finished_ = 0;  // items the worker has finished
  std::thread worker_;
};

}  // namespace dtensor::detail::shm
