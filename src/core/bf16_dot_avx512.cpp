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

// Four sums, one per vector, in one __m128: each vector folded onto its first 128 bits by lane shuffles (every
// 128-bit lane then holds the vector's four partial sums), then two horizontal adds.
inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const auto fold = [](__m512 v) {
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));  // + the other 256 bits
    v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));  // + the neighbouring 128 bits
    return _mm512_castps512_ps128(v);
  };
  return _mm_hadd_ps(_mm_hadd_ps(fold(a), fold(b)), _mm_hadd_ps(fold(c), fold(d)));
}

// A register tile: 4 rows of x against NR (4 or 1) consecutive rows of w, y[m * ldy + j] = x[m] . w[j]. Each 32-wide
// chunk of k loads 4 x vectors and NR w vectors for 4 * NR dot products (dot_rows above loads an x vector per
// product, twice the loads per product at 4 x 4: the limit from 4 rows on); 2 KB ahead of each of w's rows is
// prefetched as in dot_rows.
template <int NR>
void tile4(const uint16_t* x, const uint16_t* w, int64_t K, float* y, int64_t ldy) {
  constexpr int MR = 4;
  constexpr int64_t kAhead = 1024;
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m) {
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  }
  const int64_t full = K - K % 32;
  const auto step = [&](int64_t k, auto load) {
    __m512bh wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = load(w + j * K + k);
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = load(x + m * K + k);
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, wv[j]);
    }
  };
  for (int64_t k = 0; k < full; k += 32) {
    for (int j = 0; j < NR; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + j * K + k + kAhead), _MM_HINT_T0);
    step(k, load_bf16);
  }
  if (full < K) {
    const __mmask32 tail = static_cast<__mmask32>((1ull << (K % 32)) - 1);
    step(full, [tail](const uint16_t* p) { return load_bf16_tail(p, tail); });
  }
  for (int m = 0; m < MR; ++m) {
    if constexpr (NR == 4) {
      _mm_storeu_ps(y + m * ldy, sum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]));
    } else {
      for (int j = 0; j < NR; ++j) y[m * ldy + j] = _mm512_reduce_add_ps(acc[m][j]);
    }
  }
}

// 4 rows of x against rows [n0, n1) of w: 4 x 4 tiles, then the rest of w's rows one at a time.
void tiles4(const uint16_t* x, const uint16_t* w, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) tile4<4>(x, w + n * K, K, y + n, ldy);
  for (; n < n1; ++n) tile4<1>(x, w + n * K, K, y + n, ldy);
}

}  // namespace

void bf16_dot_rows_avx512(const uint16_t* x, int64_t rows, const uint16_t* w, int64_t K, int64_t n0, int64_t n1,
                          float* y, int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<1>(x, w, K, n0, n1, y, ldy);
    case 2: return dot_rows<2>(x, w, K, n0, n1, y, ldy);
    case 3: return dot_rows<3>(x, w, K, n0, n1, y, ldy);
    default: return tiles4(x, w, K, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail
