// Attention of a packed step straight from the paged pool (vLLM's paged_attention op): each sequence's queries read
// only that sequence's blocks, in place. The reference (PagedKVCache::update + the model's mask) gathers the keys of
// every sequence of the step side by side, K = the sum of their lengths, and masks a [T, K] block-diagonal: O(T x K),
// i.e. O(B^2 x context) for a decode step of B sequences, and a copy of the whole live cache per layer. Here each
// sequence costs rows_i x length_i and nothing is copied.
//
//   out[0, h, r, :] = softmax_j(softcap(q[0, h, r, :] . k[0, h / rep, slot(j), :] * scale)) v[0, h / rep, slot(j), :]
//
// over the keys j of r's sequence that r sees (0 <= pos(r) - j, and pos(r) - j < window with a sliding window), rep =
// heads / kv_heads (grouped-query attention), the softmax and sums in fp32, the result rounded to q's dtype once.
// Three routes, one per kind of sequence, chosen per call:
//   - decode rows (a sequence with <= kKernelRows new tokens: one token, or a few speculated ones) on a CPU with AVX2 +
//     FMA and head_dim a multiple of 8: our kernel (paged_attention_avx2.cpp; bf16 pools on CPUs with AVX-512 BF16 and
//     head_dim a multiple of 32: paged_attention_avx512.cpp, scores from the bf16 rows), one task per (sequence, kv head) that
//     reads the sequence's keys and values once for all its rows and the kv head's rep query heads, online softmax
//     over blocks of keys (flash attention's running max and sum);
//   - longer rows (a prompt being prefilled) and every other case: that sequence alone through
//     dtensor::nn::scaled_dot_product_attention over its keys gathered from its slots (ATen's GEMM-based kernel);
//   - the reference, with fast kernels off (DTENSOR_FAST_KERNELS=0): the step is packed with attention_from_pool
//     false and the model's block-diagonal mask runs instead (paged_kv_cache.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "common/kv_cache_layer.h"

namespace inference {

// Sequences with more new tokens than this go through the per-sequence ATen route.
inline constexpr int64_t kKernelRows = 16;

// Fills step.query_start / key_start from query_seq / key_seq (consecutive runs, as pack_step lays them) and sets
// attention_from_pool when fast kernels are on. Throws dtensor::Error for sequences out of order.
void index_sequences(models::PagedStep& step);

// q [1, heads, T, head_dim] (the step's T new tokens); pool_k, pool_v [1, kv_heads, slots, head_dim], the new tokens'
// keys already written; plain tensors (PagedKVCache takes DTensors' local shards: heads are sharded, each rank attends
// over its own). Returns [1, heads, T, head_dim] in q's dtype. No autograd.
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& pool_k, const at::Tensor& pool_v,
                           const models::PagedStep& step, std::optional<double> scale,
                           const dtensor::nn::AttentionKwargs& kwargs);

// Whether q and a cache tensor (DTensors) are sharded alike by heads only (Shard(1) or Replicate on each mesh dim):
// each rank then attends over its own heads with no communication, and its output is its shard of the output's heads.
bool sharded_by_heads_alike(const at::Tensor& q, const at::Tensor& cache);

// The route of a sequence with `rows` new tokens on this machine for these tensors: "kernel" or "sdpa".
const char* paged_attention_route(const at::Tensor& q, const at::Tensor& pool_k, int64_t rows);

}  // namespace inference
