#include "common/forward_context.h"

namespace models {
namespace {
thread_local const ForwardContext* current = nullptr;
}  // namespace

int64_t ForwardContext::past() const {
  return kv_caches.empty() || paged_step || !kv_caches.front() ? 0 : kv_caches.front()->length();
}

KVCacheLayer* ForwardContext::cache(int64_t layer) const {
  return kv_caches.empty() ? nullptr : kv_caches.at(static_cast<size_t>(layer)).get();
}

const ForwardContext* forward_context() { return current; }

ForwardContextGuard::ForwardContextGuard(const ForwardContext& ctx) : previous_(current) { current = &ctx; }

ForwardContextGuard::~ForwardContextGuard() { current = previous_; }

}  // namespace models
