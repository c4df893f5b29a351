// Bytes the calling thread allocates through LibTorch's CPU allocator, current and peak: a pass-through
// allocator installed once, counting only on threads that opted in (ranks are threads in these tests).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace llama_test {

struct AllocCounter {
  int64_t current = 0;
  int64_t peak = 0;
};

class CountingAllocator final : public c10::Allocator {
 public:
  // Installs the counting allocator (once per process) and returns it.
  static CountingAllocator& install() {
    static CountingAllocator* instance = [] {
      c10::Allocator* base = c10::GetCPUAllocator();
      // Every pointer goes back through the base allocator's raw deleter (the default CPU allocator's data is its
      // context), so this allocator keeps raw_allocate / raw_deallocate working for the kernels that use them.
      TORCH_CHECK(base->raw_deleter() != nullptr, "CountingAllocator: the CPU allocator has no raw deleter");
      base_free() = base->raw_deleter();
      auto* a = new CountingAllocator(base);
      c10::SetCPUAllocator(a, /*priority=*/100);
      return a;
    }();
    return *instance;
  }
  // Counts the calling thread's allocations into `counter` while alive.
  struct Scope {
    explicit Scope(AllocCounter& counter) { slot() = &counter; }
    ~Scope() { slot() = nullptr; }
  };

  c10::DataPtr allocate(size_t n) override {
    c10::DataPtr inner = base_->allocate(n);
    const c10::Device device = inner.device();
    void* data = inner.release_context();  // == inner.get(): owned here now, freed by release()
    if (AllocCounter* counter = slot()) {
      std::lock_guard<std::mutex> lock(mutex());
      live()[data] = {static_cast<int64_t>(n), counter};
      counter->current += static_cast<int64_t>(n);
      counter->peak = std::max(counter->peak, counter->current);
    }
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  struct Counted {
    int64_t bytes;
    AllocCounter* counter;  // outlives the tensors it counts in these tests
  };
  static void release(void* p) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      auto it = live().find(p);
      if (it != live().end()) {
        it->second.counter->current -= it->second.bytes;
        live().erase(it);
      }
    }
    base_free()(p);
  }
  static std::unordered_map<void*, Counted>& live() {
    static auto* m = new std::unordered_map<void*, Counted>();
    return *m;
  }
  static std::mutex& mutex() {
    static auto* m = new std::mutex();
    return *m;
  }
  static c10::DeleterFnPtr& base_free() {
    static c10::DeleterFnPtr f = nullptr;
    return f;
  }
  static AllocCounter*& slot() {
    thread_local AllocCounter* counter = nullptr;
    return counter;
  }
  c10::Allocator* base_;
};

}  // namespace llama_test
