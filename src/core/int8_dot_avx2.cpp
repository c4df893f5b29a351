// The weight-only int8 inner loop of dtensor::int8_weight_linear (fast_kernels.h) for few rows of x: compiled with
// -mavx2 -mfma alone in its file, entered only after fast_kernels.cpp checked the CPU. Raw pointers, no LibTorch.
//
// The int8 weights are widened in registers as they stream in (8 bytes sign-extended to 32-bit lanes, converted to
// fp32: exact) and multiplied with x already in fp32 (its bf16 values, exact): each product is exact in fp32, the sums
// are fp32, as the bf16 kernels'. Three instructions a weight vector at one row of x, against the ten of widening
// into a buffer first and reading it again: at a decode step's few rows the int8 bytes stream at the memory's rate.
#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail {
namespace {

inline __m256 widen8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline float sum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// y[m * ldy + n] = sum_k xf[m * K + k] * q[n * K + k] for m < M, n in [n0, n1): q's rows read in order (one stream a
// thread), four accumulators a row of x keep the sums independent; K's tail (K % 8) in scalar code.
template <int M>
void dot_rows(const float* xf, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int U = 4;             // 8-wide chunks per step: 32 weights, half a cache line
  constexpr int64_t kAhead = 2048;  // bytes of q prefetched ahead (across page boundaries)
  const int64_t steps = K / (8 * U) * (8 * U), full = K / 8 * 8;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    __m256 acc[M][U];
    for (int m = 0; m < M; ++m) {
      for (int u = 0; u < U; ++u) acc[m][u] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k < steps; k += 8 * U) {
      if ((k & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(row + k + kAhead), _MM_HINT_T0);
      for (int u = 0; u < U; ++u) {
        const __m256 w = widen8(row + k + 8 * u);
        for (int m = 0; m < M; ++m) acc[m][u] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + m * K + k + 8 * u), w, acc[m][u]);
      }
    }
    for (; k < full; k += 8) {
      const __m256 w = widen8(row + k);
      for (int m = 0; m < M; ++m) acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + m * K + k), w, acc[m][0]);
    }
    for (int m = 0; m < M; ++m) {
      float s = sum8(_mm256_add_ps(_mm256_add_ps(acc[m][0], acc[m][1]), _mm256_add_ps(acc[m][2], acc[m][3])));
      for (int64_t t = full; t < K; ++t) s += xf[m * K + t] * static_cast<float>(row[t]);
      y[m * ldy + n] = s;
    }
  }
}

}  // namespace

void int8_dot_rows_avx2(const float* xf, int64_t rows, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<1>(xf, q, K, n0, n1, y, ldy);
    case 2: return dot_rows<2>(xf, q, K, n0, n1, y, ldy);
    case 3: return dot_rows<3>(xf, q, K, n0, n1, y, ldy);
    default: return dot_rows<4>(xf, q, K, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail
