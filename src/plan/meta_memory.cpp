#include "plan/meta_memory.h"

#include <c10/core/Allocator.h>

#include <mutex>
#include <utility>

#include "ops/output_meta.h"

namespace dtensor::detail {
namespace {

thread_local std::shared_ptr<MetaMemoryCounter::Totals> active;

// One record per counted storage: freed with the storage, it gives its bytes back.
struct Record {
  std::shared_ptr<MetaMemoryCounter::Totals> totals;
  int64_t bytes;
};

void release(void* ctx) {
  auto* record = static_cast<Record*>(ctx);
  record->totals->live -= record->bytes;
  delete record;
}

// The meta device's allocator with counting in front: storages allocated while a counter is active on the
// thread carry a Record; the others are the wrapped allocator's, as before. The dispatcher's shape inference is
// not counted: it runs on a decision-cache miss only, and whether a key hits depends on what ran before in the
// process (a mesh's address is part of the key), so counting it made the numbers vary from run to run.
class CountingMetaAllocator final : public c10::Allocator {
 public:
  explicit CountingMetaAllocator(c10::Allocator* wrapped) : wrapped_(wrapped) {}
  c10::DataPtr allocate(size_t n) override {
    if (!active || ops::in_shape_inference()) return wrapped_->allocate(n);
    const auto bytes = static_cast<int64_t>(n);
    const int64_t now = active->live += bytes;
    active->allocated += bytes;
    int64_t peak = active->peak.load();
    while (now > peak && !active->peak.compare_exchange_weak(peak, now)) {
    }
    return c10::DataPtr(nullptr, new Record{active, bytes}, &release, c10::Device(c10::DeviceType::Meta));
  }
  void copy_data(void*, const void*, std::size_t) const override {}  // meta: nothing to copy

 private:
  c10::Allocator* wrapped_;
};

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CountingMetaAllocator counting(c10::GetAllocator(c10::DeviceType::Meta));
    c10::SetAllocator(c10::DeviceType::Meta, &counting, /*priority=*/255);
  });
}

}  // namespace

MetaMemoryCounter::MetaMemoryCounter() : totals_(std::make_shared<Totals>()) {
  install_once();
  previous_ = std::exchange(active, totals_);
}

MetaMemoryCounter::~MetaMemoryCounter() { active = std::move(previous_); }

int64_t MetaMemoryCounter::live_bytes() const { return totals_->live.load(); }
int64_t MetaMemoryCounter::peak_bytes() const { return totals_->peak.load(); }
int64_t MetaMemoryCounter::allocated_bytes() const { return totals_->allocated.load(); }
void MetaMemoryCounter::reset_peak() { totals_->peak = totals_->live.load(); }

}  // namespace dtensor::detail
