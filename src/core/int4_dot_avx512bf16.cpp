// The weight-only int4 inner loop of dtensor::int4_weight_linear for few rows of bf16 x on a CPU with AVX-512 BF16
// (Zen 4/5, Sapphire Rapids): compiled with -mavx512f -mavx512bw -mavx512bf16 -mf16c alone in its file, entered only
// after int4_linear.cpp checked the CPU. Raw pointers, no LibTorch. The layout: int4_dot_avx512.cpp's.
//
// 32 bytes (two chunks, 64 values) widened to 16-bit lanes hold the low nibbles in bits 0-3 and the high ones in bits
// 4-7. OR-ed with 0x4300 (bf16's 128.0), a nibble v becomes the bf16 bits of 128 + v exactly (bf16 counts by ones from
// 128 to 255), so one vdpbf16ps multiplies 32 of them with 32 values of x and sums pairs into fp32 (exact products).
// x is given in the order that matches (int4_linear.cpp permutes it once a call): per 64 values from k0, first the
// 32 that the low nibbles hold, x[k0 .. k0 + 15] and x[k0 + 32 .. k0 + 47], then the high ones'. A group's sum of
// (128 + v) x times s, plus (z - 136 s) times the group's sum of x, is its sum of ((v - 8) s + z) x: per 64 weights
// one widening, three integer ops and two dot products, half the fp32 kernel's. The cost of the offset: the sums
// carry 128 |x| where the result carries ~8 |x|, four of fp32's 24 bits; the output is rounded to bf16 (8 bits).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/int4_scales.h"

namespace dtensor::detail {
namespace {

inline __m512bh load_bf16(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// The 64 values of the 32 bytes at `bytes` as bf16 128 + v: lo (low nibbles), hi (high nibbles).
inline void nibbles(const uint8_t* bytes, __m512bh& lo, __m512bh& hi) {
  const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes)));
  const __m512i low4 = _mm512_set1_epi16(0x000F), bias = _mm512_set1_epi16(0x4300);
  lo = (__m512bh)_mm512_ternarylogic_epi32(w, low4, bias, 0xEA);  // (w & 0xF) | 0x4300
  hi = (__m512bh)_mm512_or_si512(_mm512_srli_epi16(w, 4), bias);
}

// Groups of 32: a step of 64 weights spans groups j and j + 1 (its fp32 lanes 0-7 and 8-15), scaled by one vector.
template <int M, int A>
inline void pair_into(const uint8_t* row, const uint16_t* xp, int64_t K, int64_t k, __m512 s, __m512 (&acc)[M][2]) {
  __m512bh lo, hi;
  nibbles(row + k / 2, lo, hi);
  for (int m = 0; m < M; ++m) {
    const __m512 part = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_setzero_ps(), lo, load_bf16(xp + m * K + k)), hi,
                                         load_bf16(xp + m * K + k + 32));
    acc[m][A] = _mm512_fmadd_ps(part, s, acc[m][A]);
  }
}

// Groups of 64 or more: a group's steps chained into one part, then scaled.
template <int M>
inline void group_into(const uint8_t* row, const uint16_t* xp, int64_t K, int64_t k0, int64_t group, float s,
                       __m512 (&acc)[M][2]) {
  __m512 part[M];
  for (int m = 0; m < M; ++m) part[m] = _mm512_setzero_ps();
  for (int64_t k = k0; k < k0 + group; k += 64) {
    __m512bh lo, hi;
    nibbles(row + k / 2, lo, hi);
    for (int m = 0; m < M; ++m) {
      part[m] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(part[m], lo, load_bf16(xp + m * K + k)), hi,
                                 load_bf16(xp + m * K + k + 32));
    }
  }
  const __m512 sv = _mm512_set1_ps(s);
  for (int m = 0; m < M; ++m) acc[m][0] = _mm512_fmadd_ps(part[m], sv, acc[m][0]);
}

template <int Kind, int M>
void dot_rows(const uint16_t* xp, const float* xsum, const uint8_t* q, const void* scale, const void* zero, int64_t K,
              int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t groups = K / group, row_bytes = K / 2;
  // Lanes 0-7 the first group's scale, 8-15 the second's (added to the pair's first index).
  const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * row_bytes;
    __m512 acc[M][2], corr[M];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = corr[m] = _mm512_setzero_ps();
    alignas(64) float sf[16] = {}, zf[16] = {};
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
      const int64_t gn = start_block<Kind, M>(scale, zero, row + g0 * group / 2, n, groups, g0, group, 136.0f, xsum,
                                              sf, zf, corr);
      const __m512 sv = _mm512_loadu_ps(sf);
      if (group == 32) {  // gn is even: K % 64 == 0
        for (int64_t j = 0; j < gn; j += 4) {
          pair_into<M, 0>(row, xp, K, (g0 + j) * 32, _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(static_cast<int>(j))), sv), acc);
          if (j + 2 < gn) {
            pair_into<M, 1>(row, xp, K, (g0 + j + 2) * 32,
                            _mm512_permutexvar_ps(_mm512_add_epi32(pair, _mm512_set1_epi32(static_cast<int>(j + 2))), sv), acc);
          }
        }
      } else {
        for (int64_t j = 0; j < gn; ++j) group_into<M>(row, xp, K, (g0 + j) * group, group, sf[j], acc);
      }
    }
    for (int m = 0; m < M; ++m) {
      y[m * ldy + n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), corr[m]));
    }
  }
}

template <int Kind>
void dot(const uint16_t* xp, const float* xs, int64_t rows, const uint8_t* q, const void* scale, const void* zero,
         int64_t K, int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<Kind, 1>(xp, xs, q, scale, zero, K, group, n0, n1, y, ldy);
    case 2: return dot_rows<Kind, 2>(xp, xs, q, scale, zero, K, group, n0, n1, y, ldy);
    case 3: return dot_rows<Kind, 3>(xp, xs, q, scale, zero, K, group, n0, n1, y, ldy);
    default: return dot_rows<Kind, 4>(xp, xs, q, scale, zero, K, group, n0, n1, y, ldy);
  }
}

}  // namespace

// Rows (<= 4) of bf16 x in the order above [rows, K] and their groups' sums xsum [rows, K / group] against int4 rows
// [n0, n1) of q, fp32 sums into y[m * ldy + n]. K a multiple of 64, `group` 32 or a multiple of 64.
void int4_dot_rows_avx512bf16(const uint16_t* xp, const float* xsum, int64_t rows, const uint8_t* q, const void* scale,
                              const void* zero, int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1,
                              float* y, int64_t ldy) {
  switch (scale_kind) {
    case 0: return dot<0>(xp, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    case 1: return dot<1>(xp, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    default: return dot<2>(xp, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail
