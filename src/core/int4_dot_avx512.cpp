// The weight-only int4 inner loop of dtensor::int4_weight_linear (fast_kernels.h) for few rows of x, in 512-bit
// vectors: compiled with -mavx512f -mf16c alone in its file, entered only after int4_linear.cpp checked the CPU. Raw
// pointers, no LibTorch.
//
// The layout (dtensor/quant/int4_weight_only.h): a row of K values is K / 2 bytes in chunks of 32 values, 16 bytes a
// chunk, byte j holding value j in its low nibble and value j + 16 in its high one (GGUF's Q4_0 block without its
// scale); value v of group g means (v - 8) * scale[g] + zero[g].
//
// A group's 16 possible weights are computed once, into one vector (table[v] = (v - 8) * s + z, in fp32: (v - 8) * s is
// exact, one rounding for + z), and a chunk's 32 nibbles index it: the 16 bytes widened to 32-bit lanes hold the low
// nibbles in bits 0-3 and the high ones in bits 4-7, and vpermps reads only bits 0-3 of each index. So a chunk costs a
// load, a widening, a shift and two permutes, shared by the rows of x, and one FMA per 16 weights per row of x: the
// weights are exactly those of the reference's dequantization (in fp32), the sums fp32.
#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail {
namespace {

// A scale's storage (int4_linear.cpp's ScaleKind): 0 fp32, 1 bf16, 2 fp16.
template <int Kind>
inline float scale_at(const void* p, int64_t i) {
  if constexpr (Kind == 0) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (Kind == 1) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  } else {
    return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  }
}

template <int Kind, int M>
void dot_rows(const float* xf, const uint8_t* q, const void* scale, const void* zero, int64_t K, int64_t group,
              int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int64_t kAhead = 1024;  // bytes of q prefetched ahead
  const int64_t groups = K / group, row_bytes = K / 2;
  const __m512 iota = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * row_bytes;
    __m512 acc[M][4];
    for (int m = 0; m < M; ++m) {
      for (int u = 0; u < 4; ++u) acc[m][u] = _mm512_setzero_ps();
    }
    for (int64_t g = 0; g < groups; ++g) {
      const float s = scale_at<Kind>(scale, n * groups + g);
      const float z = zero == nullptr ? 0.0f : scale_at<Kind>(zero, n * groups + g);
      const __m512 table = _mm512_fmadd_ps(iota, _mm512_set1_ps(s), _mm512_set1_ps(z));
      for (int64_t c = 0; c < group; c += 64) {  // two chunks a step (a group is a multiple of 64 or exactly 32)
        const int64_t k = g * group + c;
        const uint8_t* b = row + k / 2;
        if ((k & 127) == 0) _mm_prefetch(reinterpret_cast<const char*>(b + kAhead), _MM_HINT_T0);
        const __m512i d0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
        const __m512 lo0 = _mm512_permutexvar_ps(d0, table), hi0 = _mm512_permutexvar_ps(_mm512_srli_epi32(d0, 4), table);
        if (c + 32 < group) {
          const __m512i d1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 16)));
          const __m512 lo1 = _mm512_permutexvar_ps(d1, table);
          const __m512 hi1 = _mm512_permutexvar_ps(_mm512_srli_epi32(d1, 4), table);
          for (int m = 0; m < M; ++m) {
            const float* xr = xf + m * K + k;
            acc[m][0] = _mm512_fmadd_ps(lo0, _mm512_loadu_ps(xr), acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(hi0, _mm512_loadu_ps(xr + 16), acc[m][1]);
            acc[m][2] = _mm512_fmadd_ps(lo1, _mm512_loadu_ps(xr + 32), acc[m][2]);
            acc[m][3] = _mm512_fmadd_ps(hi1, _mm512_loadu_ps(xr + 48), acc[m][3]);
          }
        } else {
          for (int m = 0; m < M; ++m) {
            const float* xr = xf + m * K + k;
            acc[m][0] = _mm512_fmadd_ps(lo0, _mm512_loadu_ps(xr), acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(hi0, _mm512_loadu_ps(xr + 16), acc[m][1]);
          }
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      y[m * ldy + n] = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3])));
    }
  }
}

template <int Kind>
void dot(const float* xf, int64_t rows, const uint8_t* q, const void* scale, const void* zero, int64_t K,
         int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<Kind, 1>(xf, q, scale, zero, K, group, n0, n1, y, ldy);
    case 2: return dot_rows<Kind, 2>(xf, q, scale, zero, K, group, n0, n1, y, ldy);
    case 3: return dot_rows<Kind, 3>(xf, q, scale, zero, K, group, n0, n1, y, ldy);
    default: return dot_rows<Kind, 4>(xf, q, scale, zero, K, group, n0, n1, y, ldy);
  }
}

}  // namespace

// Rows (<= 4) of x in fp32 [rows, K] against int4 rows [n0, n1) of q, fp32 sums into y[m * ldy + n]. `group` is 32 or
// a multiple of 64; K a multiple of it.
void int4_dot_rows_avx512(const float* xf, int64_t rows, const uint8_t* q, const void* scale, const void* zero,
                          int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (scale_kind) {
    case 0: return dot<0>(xf, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    case 1: return dot<1>(xf, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    default: return dot<2>(xf, rows, q, scale, zero, K, group, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail
