// The two things a decoder's code needs from incremental decoding, declared here so the model does not depend on
// the inference layer that makes them (inference/kv_cache.h, inference/paged_kv_cache.h):
//   - KVCacheLayer: what one attention layer's cache does for it: take the new tokens' keys and values, give back
//     the keys and values they attend to. inference/ builds and owns them and hands them to a forward through
//     its context (common/forward_context.h), one per layer.
//   - PagedStep: the input of one packed forward of continuous batching (vLLM's attention metadata): the new
//     tokens of several sequences side by side, and the keys each sequence reads (inference/paged_kv_cache.h packs
//     it from the sequences' block tables).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "dtensor/nn/attention.h"

namespace models {

// The sliding window's cache rule, in one place (HF's DynamicSlidingWindowLayer): a query sees at most `window` keys,
// itself included, so after `past` positions a sliding layer's cache keeps the last window - 1 of them: positions
// [sliding_first_kept(past, window), past). The cache (inference/kv_cache.h) keeps them, and the model narrows a
// sliding layer's mask to the same columns.
inline int64_t sliding_first_kept(int64_t past, int64_t window) { return std::max<int64_t>(0, past - (window - 1)); }

class KVCacheLayer {
 public:
  virtual ~KVCacheLayer() = default;
  // k, v [b, kv_heads, s, head_dim] of the s new tokens -> the keys and values they attend to
  // ([b, kv_heads, kept + s, head_dim] for a dense cache; [1, kv_heads, K, head_dim] for a paged step).
  virtual std::pair<at::Tensor, at::Tensor> update(const at::Tensor& k, const at::Tensor& v) = 0;
  // Attention done by the cache itself, from where it keeps the keys (a paged cache reads each sequence's blocks in
  // place: inference/paged_attention.h): stores k, v as update() does and returns softmax(q k^T * scale) v over the
  // keys each query sees, [b, heads, s, head_dim]; undefined where it does not (the model then calls update() and
  // attends with its mask). scale nullopt: head_dim^-1/2. No autograd.
  virtual at::Tensor attend(const at::Tensor& /*q*/, const at::Tensor& /*k*/, const at::Tensor& /*v*/,
                            std::optional<double> /*scale*/, const dtensor::nn::AttentionKwargs& /*kwargs*/) {
    return {};
  }
  // Positions cached for the whole batch (a dense cache); a paged cache's positions are per sequence and come with
  // each PagedStep, so it says 0.
  virtual int64_t length() const = 0;
  // Whether the layer attends through a PagedStep (continuous batching) rather than a dense per-batch cache.
  virtual bool paged() const = 0;
};

// One forward of continuous batching: T new tokens of n sequences, and the K keys they read.
struct PagedStep {
  at::Tensor tokens;       // [T] int64
  at::Tensor positions;    // [T] each token's position in its sequence
  at::Tensor query_seq;    // [T] the step's sequence each token belongs to (0..n-1)
  at::Tensor write_slots;  // [T] the cache slot of each new token
  at::Tensor key_slots;    // [K] the slots each sequence reads: all its positions up to its last new token
  at::Tensor key_pos;      // [K] their positions
  at::Tensor key_seq;      // [K] their sequences
  at::Tensor logit_rows;   // [n_out] the tokens (indices into T) whose logits the caller wants
  // On the host, n + 1 offsets each: sequence i's new tokens are rows [query_start[i], query_start[i + 1]) and its keys
  // key_slots[key_start[i], key_start[i + 1]), at positions 0, 1, ... (inference::index_sequences fills them).
  std::vector<int64_t> query_start, key_start;
  // The caches attend from their pools, each sequence over its own blocks (KVCacheLayer::attend), and the model builds
  // no mask; false: the reference, every sequence's keys gathered side by side under a block-diagonal mask.
  bool attention_from_pool = false;
};

}  // namespace models
