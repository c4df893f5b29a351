// The KV cache of continuous batching (vLLM's PagedAttention, transformers' PagedAttentionCache): one pool of
// slots per layer, cut into blocks of block_size positions. A sequence owns a list of blocks (its block table,
// kept by the server's scheduler, not here); position p of it lives in slot table[p / block_size] * block_size +
// p % block_size. Memory follows the live tokens: a sequence holds ceil(length / block_size) blocks and gives them
// back when it ends.
//
// One forward (a PagedStep) packs the new tokens of several sequences side by side in one row [1, T]: a prompt
// (or a chunk of one) being prefilled, and one token per sequence being decoded. Each layer writes the new keys
// and values to their slots, then reads back, for every sequence in the step, the keys of all its positions so
// far ([1, kv_heads, K, head_dim], sequence after sequence); a block-diagonal causal mask (paged_attention_inputs,
// model.h) lets each query see only its own sequence's keys at or before its position. That is the reference; with
// fast kernels on (the default) a step is packed with attention_from_pool and each layer's attend() runs
// paged_attention (paged_attention.h) over every sequence's own blocks in place: no gather, no mask.
//
// Plain tensor code, no parallel code. Under llama::inference_plan the keys and values are DTensors sharded by
// heads (Shard(1)): the pool made by new_zeros keeps that shard, and index_copy_ / index_select along the slots
// dim (not sharded) are local: each rank stores and reads only its own heads, with no communication.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/kv_cache_layer.h"

namespace inference {

// One forward of continuous batching (common/kv_cache_layer.h: the model's input).
using models::PagedStep;

// One sequence's part of a step: its new tokens, after `start` cached positions, and the blocks that hold (or
// will hold) positions [0, start + tokens.size()).
struct PagedChunk {
  std::vector<int64_t> tokens;
  int64_t start = 0;
  std::vector<int64_t> block_table;
  int64_t logits = 1;  // the caller wants the logits of its last `logits` new tokens (0: none; more: speculation)
};
// The chunks side by side (in order), as one PagedStep, its sequences indexed (paged_attention.h: index_sequences).
// Throws dtensor::Error for an empty chunk or a block table too short for its positions.
PagedStep pack_step(const std::vector<PagedChunk>& chunks, int64_t block_size);

class PagedKVCache : public std::enable_shared_from_this<PagedKVCache> {
 public:
  // Throws dtensor::Error unless all are positive.
  PagedKVCache(int64_t num_layers, int64_t num_blocks, int64_t block_size);
  // Writes k, v [1, kv_heads, T, head_dim] of layer `layer` to the step's write slots and returns that layer's
  // keys and values at the step's key slots, [1, kv_heads, K, head_dim]. The pool is allocated at the first call;
  // the slots are checked at layer 0 (dtensor::Error outside the pool).
  std::pair<at::Tensor, at::Tensor> update(int64_t layer, const at::Tensor& k, const at::Tensor& v, const PagedStep& step);
  // Writes k, v as update() does and returns paged_attention of q [1, heads, T, head_dim] over the pool (DTensors:
  // on each rank's heads, the result sharded as q).
  at::Tensor attend(int64_t layer, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const PagedStep& step,
                    std::optional<double> scale, const dtensor::nn::AttentionKwargs& kwargs);
  // One view per layer, in order, for a forward's context (common/forward_context.h: ForwardContext{layers(), &step});
  // each writes and reads its layer's pool at the slots of the context's PagedStep.
  std::vector<std::shared_ptr<models::KVCacheLayer>> layers();
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_slots() const { return num_blocks_ * block_size_; }

 private:
  int64_t num_blocks_, block_size_;
  std::vector<at::Tensor> k_, v_;  // per layer: [1, kv_heads, num_slots, head_dim]
  void write(int64_t layer, const at::Tensor& k, const at::Tensor& v, const PagedStep& step);
};

}  // namespace inference
