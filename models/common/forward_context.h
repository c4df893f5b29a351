// What a forward reads from outside the model besides its inputs (vLLM's ForwardContext, set_forward_context): the
// KV cache of every attention layer and, for a packed step of continuous batching, the step's metadata. The model
// holds no cache: inference/ owns the caches and sets the context around each forward; a forward without one is the
// training forward (no cache, causal over its tokens). So the model has one forward signature for training, dense
// generation and paged serving.
//
//   models::ForwardContext ctx{inference::make_kv_caches(config, max_len)};
//   models::ForwardContextGuard on(ctx);   // this thread's forwards read ctx until `on` is destroyed
//   hidden = model->model(tokens, attention_mask);
//
// The context is per thread (threads as ranks each set their own), as the attention override of
// dtensor/nn/attention.h is; a guard restores the previous context (nested forwards).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/kv_cache_layer.h"

namespace models {

struct ForwardContext {
  std::vector<std::shared_ptr<KVCacheLayer>> kv_caches;  // one per attention layer, in order; empty: no cache
  const PagedStep* paged_step = nullptr;                  // a packed step of continuous batching (paged caches)
  // Dense caches: the forward's attention mask is exactly this many padding columns at the left of each batch row
  // (generate's left padding, HF's layout), causal over the rest. Set, a dense cache may attend itself from where it
  // keeps the keys (KVCacheLayer::attend); empty: nothing is known of the mask, and the model's mask runs.
  std::vector<int64_t> left_padding;
  // Positions cached ahead of this forward (dense caches: the first layer's length; 0 without a cache or paged).
  int64_t past() const;
  // The cache of attention layer `layer`, or null without caches.
  KVCacheLayer* cache(int64_t layer) const;
};

// This thread's context, or null (the training forward).
const ForwardContext* forward_context();

// Makes `ctx` this thread's context while alive (ctx must outlive it); the previous one comes back after.
class ForwardContextGuard {
 public:
  explicit ForwardContextGuard(const ForwardContext& ctx);
  ~ForwardContextGuard();
  ForwardContextGuard(const ForwardContextGuard&) = delete;
  ForwardContextGuard& operator=(const ForwardContextGuard&) = delete;

 private:
  const ForwardContext* previous_;
};

}  // namespace models
