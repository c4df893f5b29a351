#include "mesh/deadline.h"

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace dtensor::detail {
namespace {

// Helpers abandoned past their deadline and still blocked. If any is at exit, static destructors must not
// run under it (it may hold a c10d or Gloo lock a destructor needs, and then exit itself would hang).
std::atomic<int> abandoned_running{0};

void end_without_static_destructors() {
  if (int n = abandoned_running.load(); n > 0) {
    std::fprintf(stderr,
                 "dtensor: %d operation(s) abandoned after their deadline are still blocked; ending the process "
                 "now with status 1, without running static destructors\n",
                 n);
    std::fflush(stderr);
    std::_Exit(1);
  }
}

}  // namespace

bool finish_within(std::chrono::milliseconds limit, std::function<void()> fn) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;
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
    if (shared->abandoned) --abandoned_running;
    shared->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->cv.wait_for(lock, limit, [&] { return shared->done; })) {
    shared->abandoned = true;
    ++abandoned_running;
    static std::once_flag registered;
    std::call_once(registered, [] { std::atexit(end_without_static_destructors); });
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
