// The weight-only int4 inner loop of dtensor::int4_weight_linear (fast_kernels.h) for few rows of x, in 512-bit
// vectors: compiled with -mavx512f -mf16c alone in its file, entered only after int4_linear.cpp checked the CPU. Raw
// pointers, no LibTorch.
//
// The layout (dtensor/quant/int4_weight_only.h): a row of K values is K / 2 bytes in chunks of 32 values, 16 bytes a
// chunk, byte j holding value j in its low nibble and value j + 16 in its high one (GGUF's Q4_0 block without its
// scale); value v of group g means (v - 8) * scale[g] + zero[g].
//
// A chunk's 16 bytes widened to 32-bit lanes hold its low nibbles in bits 0-3 and its high ones in bits 4-7, masked and
// shifted out and converted to fp32 (exact). The dot product sums v * x per group (exact products, fp32 sums) and
// scales each group's sum once (below); the dequantization (a prefill's blocks) builds (v - 8) * s + z in fp32
// ((v - 8) * s exact, one rounding for + z), exactly the reference's weights. One shuffle a chunk (the widening),
// shared by the rows of x. (A 16-entry table per group indexed by vpermps, two shuffles more a chunk, ran at a third
// of this speed on the Zen 5 VM; building each weight before the dot product, two ops more a chunk, at 0.7x.)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/int4_scales.h"

namespace dtensor::detail {
namespace {

// A chunk's 32 weights from its 16 bytes: the bytes widened to 32-bit lanes, the low and the high nibbles masked and
// shifted out, v - 8 converted to fp32 (exact), (v - 8) * s + z in one FMA (the product exact, one rounding).
inline void weights(const uint8_t* bytes, __m512 sv, __m512 zv, __m512& lo, __m512& hi) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes)));
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512i vlo = _mm512_sub_epi32(_mm512_and_si512(d, _mm512_set1_epi32(15)), eight);
  const __m512i vhi = _mm512_sub_epi32(_mm512_srli_epi32(d, 4), eight);
  lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(vlo), sv, zv);
  hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(vhi), sv, zv);
}

// sum_k w[k] x[k] over a row = sum_g s_g sum_{k in g} v_k x_k + (z_g - 8 s_g) sum_{k in g} x_k: per group the nibbles
// v (0..15, exact in fp32) times x (exact products), their sum times s_g; the second term once per 16 groups from the
// groups' sums of x (int4_linear.cpp computes them per call). Two vector ops a chunk fewer than building each weight.

// Group g of a row, sum_k v_k x_k times s, into accumulator A of each row of x; G: the group size when known at compile
// time (32, GGUF's and the common case: one chunk, no loop), else 0 and `group`.
template <int M, int A, int G>
inline void group_into(const uint8_t* row, const float* xf, int64_t K, int64_t group, int64_t g, float s,
                       __m512 (&acc)[M][2]) {
  const uint64_t size = G > 0 ? G : static_cast<uint64_t>(group);
  const uint64_t k0 = static_cast<uint64_t>(g) * size;
  const __m512i mask = _mm512_set1_epi32(15);
  __m512 part[M];
  for (uint64_t k = k0; k < k0 + size; k += 32) {
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(d, mask));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4));
    for (int m = 0; m < M; ++m) {
      const __m512 p = _mm512_mul_ps(lo, _mm512_loadu_ps(xf + m * K + k));
      part[m] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xf + m * K + k + 16), k == k0 ? p : _mm512_add_ps(part[m], p));
    }
  }
  const __m512 sv = _mm512_set1_ps(s);
  for (int m = 0; m < M; ++m) acc[m][A] = _mm512_fmadd_ps(part[m], sv, acc[m][A]);
}

// Scales and zeros converted 16 groups at a time; consecutive groups sum into alternate accumulators.
template <int Kind, int M, int G>
void dot_rows(const float* xf, const float* xsum, const uint8_t* q, const void* scale, const void* zero, int64_t K,
              int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t groups = K / group, row_bytes = K / 2;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * row_bytes;
    __m512 acc[M][2], corr[M];
    for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = corr[m] = _mm512_setzero_ps();
    alignas(64) float sf[16] = {}, zf[16] = {};
    for (int64_t g0 = 0; g0 < groups; g0 += 16) {
      // (z_g - 8 s_g) times the groups' sums of x into corr.
      const int64_t gn = start_block<Kind, M>(scale, zero, row + g0 * group / 2, n, groups, g0, group, 8.0f, xsum, sf,
                                              zf, corr);
      // Groups in pairs, into accumulators 0 and 1 (constant indices: the accumulators stay in registers).
      for (int64_t j = 0; j < gn; j += 2) {
        group_into<M, 0, G>(row, xf, K, group, g0 + j, sf[j], acc);
        if (j + 1 < gn) group_into<M, 1, G>(row, xf, K, group, g0 + j + 1, sf[j + 1], acc);
      }
    }
    for (int m = 0; m < M; ++m) {
      y[m * ldy + n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), corr[m]));
    }
  }
}

// Rows [n0, n1) dequantized into out [(n1 - n0), K] fp32, the same table per group.
template <int Kind>
void dequantize(const uint8_t* q, const void* scale, const void* zero, int64_t K, int64_t group, int64_t n0,
                int64_t n1, float* out) {
  const int64_t groups = K / group, row_bytes = K / 2;
  for (int64_t n = n0; n < n1; ++n) {
    float* o = out + (n - n0) * K;
    for (int64_t g = 0; g < groups; ++g) {
      const __m512 sv = _mm512_set1_ps(scale_at<Kind>(scale, n * groups + g));
      const __m512 zv = _mm512_set1_ps(zero == nullptr ? 0.0f : scale_at<Kind>(zero, n * groups + g));
      for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
        __m512 lo, hi;
        weights(q + n * row_bytes + k / 2, sv, zv, lo, hi);
        _mm512_storeu_ps(o + k, lo);
        _mm512_storeu_ps(o + k + 16, hi);
      }
    }
  }
}

template <int Kind, int G>
void dot(const float* xf, const float* xs, int64_t rows, const uint8_t* q, const void* scale, const void* zero,
         int64_t K, int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<Kind, 1, G>(xf, xs, q, scale, zero, K, group, n0, n1, y, ldy);
    case 2: return dot_rows<Kind, 2, G>(xf, xs, q, scale, zero, K, group, n0, n1, y, ldy);
    case 3: return dot_rows<Kind, 3, G>(xf, xs, q, scale, zero, K, group, n0, n1, y, ldy);
    default: return dot_rows<Kind, 4, G>(xf, xs, q, scale, zero, K, group, n0, n1, y, ldy);
  }
}

template <int Kind>
void dot(const float* xf, const float* xs, int64_t rows, const uint8_t* q, const void* scale, const void* zero,
         int64_t K, int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (group == 32) return dot<Kind, 32>(xf, xs, rows, q, scale, zero, K, group, n0, n1, y, ldy);
  dot<Kind, 0>(xf, xs, rows, q, scale, zero, K, group, n0, n1, y, ldy);
}

}  // namespace

// Rows (<= 4) of x in fp32 [rows, K] and their groups' sums xsum [rows, K / group] against int4 rows [n0, n1) of q,
// fp32 sums into y[m * ldy + n]. `group` is a multiple of 32; K a multiple of it.
void int4_dot_rows_avx512(const float* xf, const float* xsum, int64_t rows, const uint8_t* q, const void* scale,
                          const void* zero, int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1, float* y,
                          int64_t ldy) {
  switch (scale_kind) {
    case 0: return dot<0>(xf, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    case 1: return dot<1>(xf, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    default: return dot<2>(xf, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
  }
}

void int4_dequantize_rows_avx512(const uint8_t* q, const void* scale, const void* zero, int scale_kind, int64_t K,
                                 int64_t group, int64_t n0, int64_t n1, float* out) {
  switch (scale_kind) {
    case 0: return dequantize<0>(q, scale, zero, K, group, n0, n1, out);
    case 1: return dequantize<1>(q, scale, zero, K, group, n0, n1, out);
    default: return dequantize<2>(q, scale, zero, K, group, n0, n1, out);
  }
}

}  // namespace dtensor::detail
