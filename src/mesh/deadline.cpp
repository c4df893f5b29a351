#include "mesh/deadline.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dtensor::detail {

bool finish_within(std::chrono::milliseconds limit, std::function<void()> fn) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
  };
  auto shared = std::make_shared<Shared>();
  std::thread helper([shared, fn = std::move(fn)]() mutable {
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    fn = nullptr;  // release what it captured before reporting done
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->done = true;
    shared->error = error;
    shared->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->cv.wait_for(lock, limit, [&] { return shared->done; })) {
    lock.unlock();
    helper.detach();  // abandoned: it keeps `shared` and whatever `fn` captured
    return false;
  }
  lock.unlock();
  helper.join();
  if (shared->error) std::rethrow_exception(shared->error);
  return true;
}

void leak_deliberately(c10::intrusive_ptr<c10d::Backend> backend) {
  static std::mutex mutex;
  static auto* kept = new std::vector<c10::intrusive_ptr<c10d::Backend>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(backend));
}

}  // namespace dtensor::detail
