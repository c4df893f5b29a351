// The AVX2 + FMA inner loop of dtensor::bf16_linear (fast_kernels.h), for CPUs without AVX-512 BF16 (AMD Zen 2 / 3,
// Intel before Cooper Lake): compiled with -mavx2 -mfma alone in its file, entered only after fast_kernels.cpp checked
// the CPU. Raw pointers, no LibTorch.
//
// No bf16 dot product here: bf16 is fp32's upper half, so one 256-bit load of 16 bf16 weights gives two fp32 vectors
// in two instructions, the odd elements by masking each 32-bit lane's low half (and) and the even ones by shifting it
// up (slli). x is converted to fp32 once per call in the same paired order (each group of 16 values of a row stored
// as its 8 even elements, then its 8 odd ones: bf16_rows_to_paired_fp32), so that lane j of the even / odd vectors
// of x and w hold the same k. A register tile is up to 4 rows of x times 2 rows of w (8 accumulators, 4 weight
// vectors, 2 x vectors): each weight vector serves 4 rows of x, each x vector 2 rows of w. K's tail (K % 16) stays in
// natural order and runs in scalar code. The sums are fp32, in a different order than PyTorch's.
//
// Prefetch: the caller names a range of w to bring into L2 while this call computes (the next block of w's rows),
// spread evenly over the call's steps (one 64-byte line whenever the step count has earned it), so that memory
// streams the next block while the FMAs run on this one instead of each block's first pass waiting for memory.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace dtensor::detail {
namespace {

constexpr int64_t kGroup = 16;  // k values per step: one 256-bit load of bf16

inline void load_bf16x16(const uint16_t* p, __m256& even, __m256& odd) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
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

// Issues `lines` 64-byte prefetches of [p, end) evenly over `steps` calls of step() (Bresenham's rule).
class Prefetcher {
 public:
  Prefetcher(const char* p, int64_t bytes, int64_t steps)
      : p_(p), end_(p + bytes), lines_(bytes / 64), steps_(std::max<int64_t>(steps, 1)) {}
  void step() {
    credit_ += lines_;
    while (credit_ >= steps_ && p_ < end_) {
      _mm_prefetch(p_, _MM_HINT_T1);
      p_ += 64;
      credit_ -= steps_;
    }
  }

 private:
  const char* p_;
  const char* end_;
  int64_t lines_, steps_, credit_ = 0;
};

// y[m * ldy + n] = sum_k x[m][k] * w[n * K + k] for m < M, n in [n0, n1), x in the paired order (row m at xf + m * ldx:
// the caller pads the rows so that a chunk's rows do not fall into the same L1 sets, as K * 4 bytes, a multiple of
// 4 KB at every decode shape, would make them).
template <int M>
void dot_rows(const float* xf, int64_t ldx, const uint16_t* w, int64_t K, int64_t n0, int64_t n1, float* y,
              int64_t ldy, const uint16_t* pf, int64_t pf_bytes) {
  const int64_t full = K - K % kGroup;
  Prefetcher prefetch(reinterpret_cast<const char*>(pf), pf_bytes, ((n1 - n0 + 1) / 2) * (full / kGroup));
  auto tail = [&](const uint16_t* row, int m, float sum) {
    for (int64_t k = full; k < K; ++k) sum += xf[m * ldx + k] * bf16_to_float(row[k]);
    return sum;
  };
  int64_t n = n0;
  for (; n + 2 <= n1; n += 2) {
    const uint16_t* r0 = w + n * K;
    const uint16_t* r1 = r0 + K;
    __m256 a0[M], a1[M];
    for (int m = 0; m < M; ++m) a0[m] = a1[m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < full; k += kGroup) {
      prefetch.step();
      __m256 w0e, w0o, w1e, w1o;
      load_bf16x16(r0 + k, w0e, w0o);
      load_bf16x16(r1 + k, w1e, w1o);
      for (int m = 0; m < M; ++m) {
        const __m256 xe = _mm256_loadu_ps(xf + m * ldx + k), xo = _mm256_loadu_ps(xf + m * ldx + k + 8);
        a0[m] = _mm256_fmadd_ps(xe, w0e, a0[m]);
        a1[m] = _mm256_fmadd_ps(xe, w1e, a1[m]);
        a0[m] = _mm256_fmadd_ps(xo, w0o, a0[m]);
        a1[m] = _mm256_fmadd_ps(xo, w1o, a1[m]);
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
    for (int64_t k = 0; k < full; k += kGroup) {
      prefetch.step();
      __m256 w0e, w0o;
      load_bf16x16(r0 + k, w0e, w0o);
      for (int m = 0; m < M; ++m) {
        a0[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + m * ldx + k), w0e, a0[m]);
        a0[m] = _mm256_fmadd_ps(_mm256_loadu_ps(xf + m * ldx + k + 8), w0o, a0[m]);
      }
    }
    for (int m = 0; m < M; ++m) y[m * ldy + n] = tail(r0, m, hsum(a0[m]));
  }
}

}  // namespace

void bf16_rows_to_paired_fp32(const uint16_t* x, int64_t M, int64_t K, float* out, int64_t ldo) {
  const int64_t full = K - K % kGroup;
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* row = x + m * K;
    float* o = out + m * ldo;
    for (int64_t k = 0; k < full; k += kGroup) {
      __m256 even, odd;
      load_bf16x16(row + k, even, odd);
      _mm256_storeu_ps(o + k, even);
      _mm256_storeu_ps(o + k + 8, odd);
    }
    for (int64_t k = full; k < K; ++k) o[k] = bf16_to_float(row[k]);
  }
}

void bf16_dot_rows_avx2(const float* xf, int64_t ldx, int64_t rows, const uint16_t* w, int64_t K, int64_t n0, int64_t n1,
                        float* y, int64_t ldy, const uint16_t* prefetch, int64_t prefetch_bytes) {
  switch (rows) {
    case 1: return dot_rows<1>(xf, ldx, w, K, n0, n1, y, ldy, prefetch, prefetch_bytes);
    case 2: return dot_rows<2>(xf, ldx, w, K, n0, n1, y, ldy, prefetch, prefetch_bytes);
    case 3: return dot_rows<3>(xf, ldx, w, K, n0, n1, y, ldy, prefetch, prefetch_bytes);
    default: return dot_rows<4>(xf, ldx, w, K, n0, n1, y, ldy, prefetch, prefetch_bytes);
  }
}

}  // namespace dtensor::detail
