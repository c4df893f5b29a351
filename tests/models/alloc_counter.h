// Bytes the calling thread allocates through LibTorch's CPU allocator, current and peak: a pass-through
// allocator installed once, counting only on threads that opted in (ranks are threads in these tests).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

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
      auto* a = new CountingAllocator(c10::GetCPUAllocator());
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
    AllocCounter* counter = slot();
    if (counter == nullptr) return inner;
    counter->current += static_cast<int64_t>(n);
    counter->peak = std::max(counter->peak, counter->current);
    void* data = inner.get();
    const c10::Device device = inner.device();
    auto* ctx = new Context{std::move(inner), static_cast<int64_t>(n), counter};
    return {data, ctx, &Context::release, device};
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
    AllocCounter* counter;  // outlives the tensors it counts in these tests (frees after it ends are harmless)
    static void release(void* p) {
      auto* ctx = static_cast<Context*>(p);
      ctx->counter->current -= ctx->bytes;
      delete ctx;
    }
  };
  static AllocCounter*& slot() {
    thread_local AllocCounter* counter = nullptr;
    return counter;
  }
  c10::Allocator* base_;
};

}  // namespace llama_test
