// The AVX2 + FMA inner loop of dtensor::bf16_linear (fast_kernels.h), for CPUs without AVX-512 BF16 (AMD Zen 2 / 3,
// Intel before Cooper Lake): compiled with -mavx2 -mfma alone in its file, entered only after fast_kernels.cpp checked
// the CPU. Raw pointers, no LibTorch.
//
// No bf16 dot product here: a weight's 8 bf16 values become fp32 by a 16-bit shift (bf16 is fp32's upper half), then
// fused multiply-adds in fp32 against the rows of x, converted to fp32 once by the caller. A register tile is up to 4
// rows of x times 2 rows of w (8 accumulators, 2 weight vectors, 1 x vector): each weight vector loaded and converted
// once serves 4 rows of x, each x vector 2 rows of w. The sums are fp32, in a different order than PyTorch's.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace dtensor::detail {
namespace {

inline __m256 load_bf16x8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// y[m * ldy + n] = sum_k xf[m * K + k] * w[n * K + k] for m < M, n in [n0, n1); K's tail (K % 8) in scalar code.
template <int M>
void dot_rows(const float* xf, const uint16_t* w, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t full = K - K % 8;
  auto tail = [&](const uint16_t* row, int m, float sum) {
    for (int64_t k = full; k < K; ++k) sum += xf[m * K + k] * bf16_to_float(row[k]);
    return sum;
  };
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    const uint16_t* r0 = w + n * K;
    const uint16_t* r1 = r0 + K;
    __m256 a0[M], a1[M];
    for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < full; k += 8) {
      const __m256 w0 = load_bf16x8(r0 + k), w1 = load_bf16x8(r1 + k);
      for (int m = 0; m < M; ++m) {
        const __m256 xv = _mm256_loadu_ps(xf + m * K + k);
        a0[m] = _mm256_fmadd_ps(xv, w0, a0[m]);
        a1[m] = _mm256_fmadd_ps(xv, w1, a1[m]);
      }
    }
    for (int m = 0; m < M; ++m) {
      y[m * ldy + n] = tail(r0, m, hsum(a0[m]));
      y[m * ldy + n + 1] = tail(r1, m, hsum(a1[m]));
    }
  }
  for (; n < n1; ++n) {  // an odd last row
    const uint16_t* r0 = w + n * K;
    __m256 a0[M];
    for (int m = 0; m < M; ++m) a0[m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < full; k += 8) {
      const __m256 w0 = load_bf16x8(r0 + k);
      for (int m = 0; m < M; ++m) a0[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + m * K + k), w0, a0[m]);
    }
    for (int m = 0; m < M; ++m) y[m * ldy + n] = tail(r0, m, hsum(a0[m]));
  }
}

}  // namespace

void bf16_dot_rows_avx2(const float* xf, int64_t rows, const uint16_t* w, int64_t K, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<1>(xf, w, K, n0, n1, y, ldy);
    case 2: return dot_rows<2>(xf, w, K, n0, n1, y, ldy);
    case 3: return dot_rows<3>(xf, w, K, n0, n1, y, ldy);
    default: return dot_rows<4>(xf, w, K, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail
