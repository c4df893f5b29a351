// One attention layer's key/value cache for incremental decoding (gpt-fast's KVCache; HF's DynamicCache
// layer without growth): keys and values [b, kv_heads, max_len, head_dim], allocated once at the first
// update for the maximum length and filled left to right, so a decoded token costs no allocation.
//
// With a sliding window W (HF's DynamicSlidingWindowLayer) the cache keeps only the last W - 1 positions
// (models::sliding_first_kept, common/kv_cache_layer.h: the rule's one home): a new query sees at most W keys, itself
// included, so older ones are never read again. update() returns the
// kept positions followed by the new ones; first() is the cache index of the first of them, and the model
// narrows its sliding mask to the columns [first(), length()) to match. Memory is O(W), not O(max_len).
//
// Decode rows attend from the cache in place (attend(): paged_attention.h's kernel over each row's own positions),
// when the forward's context says its mask is left padding only; else update() gives the keys back for the model's
// mask and SDPA.
//
// Plain tensor code, no parallel code. Under a TP plan the keys and values arrive as DTensors sharded by
// heads (Shard(1), ColwiseParallel k/v projections); new_zeros keeps a Shard of a dim whose size it keeps
// (src/ops/tensor_ops.cpp), narrow and cat on the unsharded length dim are local, and copy_ between
// equal layouts is a local copy: each rank allocates and fills only its own heads, with no communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/kv_cache_layer.h"
#include "llama/config.h"

namespace inference {

class KVCache : public models::KVCacheLayer {
 public:
  // window 0: keep every position.
  explicit KVCache(int64_t max_len, int64_t window = 0);
  // Writes k, v [b, kv_heads, s, head_dim] at positions [length(), length() + s) and returns the keys and
  // values of positions [first(), length() + s) (views of the cache). Throws dtensor::Error past max_len or
  // when the batch or heads differ from the first update's.
  std::pair<at::Tensor, at::Tensor> update(const at::Tensor& k, const at::Tensor& v) override;
  // With the context's left_padding and up to kKernelRows new tokens per row, none of them padding, on a CPU where
  // paged_attention's kernel runs (no window kept): stores k, v as update() does and returns the attention of q over
  // each row's positions [pad, length() + s), causal; else undefined, the cache untouched.
  at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, std::optional<double> scale,
                    const dtensor::nn::AttentionKwargs& kwargs) override;
  int64_t length() const override { return length_; }  // positions seen
  bool paged() const override { return false; }
  int64_t first() const { return first_; }    // the first position update() returned last (0 without a window)
  int64_t max_len() const { return max_len_; }
  int64_t window() const { return window_; }
  // The kept keys and values (undefined before the first update).
  const at::Tensor& keys() const { return k_; }
  const at::Tensor& values() const { return v_; }

 private:
  int64_t max_len_;
  int64_t window_;
  int64_t length_ = 0;
  int64_t first_ = 0;
  at::Tensor k_, v_;
};

// A fresh cache of max_len positions for each layer of a model with `config` (a sliding layer keeps its window), for a
// forward's context (common/forward_context.h; buffers allocated at the first forward).
std::vector<std::shared_ptr<models::KVCacheLayer>> make_kv_caches(const llama::LlamaConfig& config, int64_t max_len);

}  // namespace inference
