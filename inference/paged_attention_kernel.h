// The CPU kernels of paged_attention.h, each alone in its file (paged_attention_avx2.cpp: built with AVX2 + FMA +
// F16C, entered only on CPUs that have them; paged_attention_avx512.cpp: bf16 pools on CPUs with AVX-512 BF16, head_dim
// a multiple of 32). Plain pointers and strides in elements; no ATen.
#pragma once

#include <cstdint>

namespace inference::detail {

enum class Elem { f32, bf16, f16 };

struct PagedAttentionArgs {
  Elem elem = Elem::f32;
  const void* q = nullptr;  // [heads, T, d] at q_head_stride, q_row_stride (d contiguous)
  int64_t q_head_stride = 0, q_row_stride = 0;
  const void* k = nullptr;  // [kv_heads, slots, d]
  const void* v = nullptr;
  int64_t k_head_stride = 0, k_slot_stride = 0, v_head_stride = 0, v_slot_stride = 0;
  void* out = nullptr;  // [heads, T, d]
  int64_t out_head_stride = 0, out_row_stride = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // head_dim a multiple of 8
  const int64_t* positions = nullptr;  // [T] each new token's position in its sequence
  const int64_t* key_slots = nullptr;  // [K]
  float scale = 1.0f;
  int64_t window = 0;    // > 0: a query sees the keys at pos - window < j <= pos
  float softcap = 0.0f;  // > 0: scores = softcap * tanh(scores / softcap)
};

// One task: kv head `g` of one sequence, its new tokens rows [r0, r1) of q, its keys key_slots[k0, k0 + len) at
// positions 0 .. len - 1. Writes out's rows [r0, r1) of the kv head's rep = heads / kv_heads query heads.
void paged_attention_avx2(const PagedAttentionArgs& a, int64_t g, int64_t r0, int64_t r1, int64_t k0, int64_t len);
// The same task for a.elem == bf16 and head_dim % 32 == 0: scores by VDPBF16PS from the pool's rows as they are.
void paged_attention_avx512_bf16(const PagedAttentionArgs& a, int64_t g, int64_t r0, int64_t r1, int64_t k0,
                                 int64_t len);

}  // namespace inference::detail
