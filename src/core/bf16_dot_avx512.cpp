// The AVX-512 BF16 inner loop of dtensor::bf16_linear (fast_kernels.h): compiled with -mavx512bf16 alone in its file,
// and entered only after fast_kernels.cpp checked the CPU. Raw pointers, no LibTorch.
#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail {
namespace {

inline __m512bh load_bf16(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
inline __m512bh load_bf16_tail(const uint16_t* p, __mmask32 mask) { return (__m512bh)_mm512_maskz_loadu_epi16(mask, p); }

// y[m * ldy + n] = sum_k x[m * K + k] * w[n * K + k] for m < M, n in [n0, n1). The rows of w are read in order, so
// each thread streams one contiguous block (the hardware prefetcher follows one stream; a software prefetch runs
// 2 KB ahead across page boundaries); four accumulators per row of x keep the dot products independent.
template <int M>
void dot_rows(const uint16_t* x, const uint16_t* w, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int U = 4;             // 32-wide chunks per step
  constexpr int64_t kAhead = 1024;  // elements (2 KB) prefetched ahead
  const int64_t steps = K / (32 * U) * (32 * U), full = K - K % 32;
  const __mmask32 tail = static_cast<__mmask32>((1ull << (K % 32)) - 1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* row = w + n * K;
    __m512 acc[M][U];
    for (int m = 0; m < M; ++m) {
      for (int u = 0; u < U; ++u) acc[m][u] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    for (; k < steps; k += 32 * U) {
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kAhead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kAhead + 32), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kAhead + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(row + k + kAhead + 96), _MM_HINT_T0);
      for (int u = 0; u < U; ++u) {
        const __m512bh wv = load_bf16(row + k + 32 * u);
        for (int m = 0; m < M; ++m) acc[m][u] = _mm512_dpbf16_ps(acc[m][u], load_bf16(x + m * K + k + 32 * u), wv);
      }
    }
    for (; k < full; k += 32) {
      const __m512bh wv = load_bf16(row + k);
      for (int m = 0; m < M; ++m) acc[m][0] = _mm512_dpbf16_ps(acc[m][0], load_bf16(x + m * K + k), wv);
    }
    if (full < K) {
      const __m512bh wv = load_bf16_tail(row + full, tail);
      for (int m = 0; m < M; ++m) acc[m][0] = _mm512_dpbf16_ps(acc[m][0], load_bf16_tail(x + m * K + full, tail), wv);
    }
    for (int m = 0; m < M; ++m) {
      const __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
      y[m * ldy + n] = _mm512_reduce_add_ps(sum);
    }
  }
}

}  // namespace

void bf16_dot_rows_avx512(const uint16_t* x, int64_t rows, const uint16_t* w, int64_t K, int64_t n0, int64_t n1,
                          float* y, int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<1>(x, w, K, n0, n1, y, ldy);
    case 2: return dot_rows<2>(x, w, K, n0, n1, y, ldy);
    case 3: return dot_rows<3>(x, w, K, n0, n1, y, ldy);
    default: return dot_rows<4>(x, w, K, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail
