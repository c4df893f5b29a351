// int8_dot_avx2.cpp's loop in 512-bit vectors (16 weights a vector, a cache line a step): compiled with -mavx512f alone
// in its file, entered only after fast_kernels.cpp checked the CPU. Raw pointers, no LibTorch. Half the instructions
// per weight of the AVX2 loop, which at 4 rows of x and more no longer kept up with the memory.
#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail {
namespace {

inline __m512 widen16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// y[m * ldy + n] = sum_k xf[m * K + k] * q[n * K + k] for m < M, n in [n0, n1): q's rows read in order (one stream a
// thread), four accumulators a row of x keep the sums independent; K's tail (K % 16) in scalar code.
template <int M>
void dot_rows(const float* xf, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int U = 4;             // 16-wide chunks per step: 64 weights, a cache line
  constexpr int64_t kAhead = 2048;  // bytes of q prefetched ahead (across page boundaries)
  const int64_t steps = K / (16 * U) * (16 * U), full = K / 16 * 16;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    __m512 acc[M][U];
    for (int m = 0; m < M; ++m) {
      for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    for (; k < steps; k += 16 * U) {
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kAhead), _MM_HINT_T0);
      for (int u = 0; u < U; ++u) {
        const __m512 w = widen16(row + k + 16 * u);
        for (int m = 0; m < M; ++m) acc[m][u] = _mm512_fmadd_ps(_mm512_loadu_ps(xf + m * K + k + 16 * u), w, acc[m][u]);
      }
    }
    for (; k < full; k += 16) {
      const __m512 w = widen16(row + k);
      for (int m = 0; m < M; ++m) acc[m][0] = _mm512_fmadd_ps(_mm512_loadu_ps(xf + m * K + k), w, acc[m][0]);
    }
    for (int m = 0; m < M; ++m) {
      float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3])));
      for (int64_t t = full; t < K; ++t) s += xf[m * K + t] * static_cast<float>(row[t]);
      y[m * ldy + n] = s;
    }
  }
}

}  // namespace

void int8_dot_rows_avx512(const float* xf, int64_t rows, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<1>(xf, q, K, n0, n1, y, ldy);
    case 2: return dot_rows<2>(xf, q, K, n0, n1, y, ldy);
    case 3: return dot_rows<3>(xf, q, K, n0, n1, y, ldy);
    default: return dot_rows<4>(xf, q, K, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail
