// Bytes of meta tensors alive, counted at the allocator: the dry run's memory measurement. Meta tensors have
// storage sizes but no data; every storage they get comes from the meta device's allocator, so a counting
// allocator in its place sees exactly what a real device's caching allocator would be asked for (without
// its rounding). Internal header.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace dtensor::detail {

// While alive, meta storages allocated on this thread are counted (until they are freed, on any thread).
class MetaMemoryCounter {
 public:
  MetaMemoryCounter();
  ~MetaMemoryCounter();
  MetaMemoryCounter(const MetaMemoryCounter&) = delete;
  MetaMemoryCounter& operator=(const MetaMemoryCounter&) = delete;

  int64_t live_bytes() const;
  int64_t peak_bytes() const;  // since construction or the last reset_peak()
  int64_t allocated_bytes() const;  // every storage allocated since construction (freed or not)
  void reset_peak();

  struct Totals {
    std::atomic<int64_t> live{0}, peak{0}, allocated{0};
  };

 private:
  std::shared_ptr<Totals> totals_;
  std::shared_ptr<Totals> previous_;  // the enclosing counter's (nested counters: the inner one counts)
};

}  // namespace dtensor::detail
