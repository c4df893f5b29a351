// One attention layer's key/value cache for incremental decoding (gpt-fast's KVCache; HF's DynamicCache
// layer without growth): keys and values [b, kv_heads, max_len, head_dim], allocated once at the first
// update for the maximum length and filled left to right, so a decoded token costs no allocation.
//
// Plain tensor code, no parallel code. Under a TP plan the keys and values arrive as DTensors sharded by
// heads (Shard(1), ColwiseParallel k/v projections); new_zeros keeps a Shard of a dim whose size it keeps
// (src/ops/tensor_ops.cpp), narrow on the unsharded length dim is the local narrow, and copy_ between
// equal layouts is a local copy: each rank allocates and fills only its own heads, with no communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace llama {

class KVCache {
 public:
  explicit KVCache(int64_t max_len);
  // Writes k, v [b, kv_heads, s, head_dim] at positions [length(), length() + s) and returns the keys and
  // values of positions [0, length() + s) (views of the cache). Throws dtensor::Error past max_len or
  // when the batch or heads differ from the first update's.
  std::pair<at::Tensor, at::Tensor> update(const at::Tensor& k, const at::Tensor& v);
  int64_t length() const { return length_; }
  int64_t max_len() const { return max_len_; }
  // The whole buffers (undefined before the first update).
  const at::Tensor& keys() const { return k_; }
  const at::Tensor& values() const { return v_; }

 private:
  int64_t max_len_;
  int64_t length_ = 0;
  at::Tensor k_, v_;
};

}  // namespace llama
