#include "mesh/shm/issue_queue.h"

#include "dtensor/core/error.h"

namespace dtensor::detail::shm {

IssueQueue::~IssueQueue() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (worker_.joinable()) worker_.join();
}

c10::intrusive_ptr<c10d::Work> IssueQueue::issue(c10d::OpType type, bool async, std::function<void()> collective) {
  auto work = c10::make_intrusive<ShmWork>(type);
  std::unique_lock<std::mutex> lock(mutex_);
  if (!async && queue_.empty() && !running_) {
    collective();  // throws to the caller, as a blocking call should; the lock keeps others behind it
    work->complete(nullptr);
    return work;
  }
  queue_.push_back(Item{std::move(collective), work});
  if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
  lock.unlock();
  wake_.notify_one();
  return work;
}

void IssueQueue::run_after_queue(const std::function<void()>& fn, std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Each queued collective is bounded by the group's timeout, so progress (one finishing) within `bound`.
  while (!queue_.empty() || running_) {
    const uint64_t seen = finished_;
    if (!drained_.wait_for(lock, bound, [&] { return finished_ != seen; })) {
      throw DTENSOR_ERROR("dtensor: asynchronous shared-memory collectives did not drain within ",
                          bound.count(), " ms");
    }
  }
  fn();
}

void IssueQueue::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and nothing left to run
    Item item = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      item.collective();
    } catch (...) {
      error = std::current_exception();
    }
    item.work->complete(error);
    item = Item{};  // release the tensors before taking the lock
    lock.lock();
    running_ = false;
    ++finished_;
    drained_.notify_all();
  }
}

}  // namespace dtensor::detail::shm
