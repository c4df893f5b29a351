// The weight-only int4 inner loops of dtensor::int4_weight_linear (fast_kernels.h) on CPUs without AVX-512 (AVX2 + FMA
// + F16C): int4_dot_avx512.cpp's sums in 256-bit vectors, compiled with -mavx2 -mfma -mf16c alone in its file, entered
// only after int4_linear.cpp checked the CPU. Raw pointers, no LibTorch.
//
// The layout (dtensor/quant/int4_weight_only.h): a row of K values is K / 2 bytes in chunks of 32 values, byte j of a
// chunk holding value j in its low nibble and value j + 16 in its high one; value v of group g means
// (v - 8) * scale[g] + zero[g]. A chunk's 16 bytes are two loads of 8 bytes widened to 32-bit lanes: the low nibbles
// of the first are values 0-7, of the second 8-15, their high nibbles 16-23 and 24-31, each masked or shifted out and
// converted to fp32 (exact).
//
// The sums as the AVX-512 kernel's: per group the nibbles v times x (exact products, fp32 sums), that sum times s_g,
// plus (z_g - 8 s_g) times the group's sum of x (int4_linear.cpp computes those per call). The dequantization (a
// prefill's blocks) builds (v - 8) * s + z in fp32 in one FMA, exactly the reference's weights.
#include <immintrin.h>

#include <cstdint>

#include "core/int4_scale_at.h"

namespace dtensor::detail {
namespace {

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// A chunk's 32 values in fp32: v[0] = values 0-7, v[1] 8-15, v[2] 16-23, v[3] 24-31.
inline void chunk_values(const uint8_t* bytes, __m256 (&v)[4]) {
  const __m256i mask = _mm256_set1_epi32(15);
  const __m256i a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes)));
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bytes + 8)));
  v[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, mask));
  v[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, mask));
  v[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
  v[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

// Rows [n0, n1) of q against M rows of x: y[m * ldy + n] = sum_g s_g sum_{k in g} v_k x_k + (z_g - 8 s_g) xsum[m][g].
// G: the group size when known at compile time (32, GGUF's: one chunk, no loop; measured 2x on the AVX-512 kernel),
// else 0 and `group`.
template <int Kind, int M, int G>
void dot_rows(const float* xf, const float* xsum, const uint8_t* q, const void* scale, const void* zero, int64_t K,
              int64_t group_arg, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t group = G > 0 ? G : group_arg;
  const int64_t groups = K / group, row_bytes = K / 2;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = q + n * row_bytes;
    __m256 acc[M];
    float corr[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm256_setzero_ps(), corr[m] = 0.0f;
    for (int64_t g = 0; g < groups; ++g) {
      const float s = scale_at<Kind>(scale, n * groups + g);
      const float z = zero == nullptr ? 0.0f : scale_at<Kind>(zero, n * groups + g);
      _mm_prefetch(reinterpret_cast<const char*>(row + g * group / 2 + 512), _MM_HINT_T0);
      __m256 part[M];
      for (int m = 0; m < M; ++m) part[m] = _mm256_setzero_ps();
      for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
        __m256 v[4];
        chunk_values(row + k / 2, v);
        for (int m = 0; m < M; ++m) {
          const float* x = xf + m * K + k;
          __m256 p = _mm256_fmadd_ps(v[0], _mm256_loadu_ps(x), part[m]);
          p = _mm256_fmadd_ps(v[1], _mm256_loadu_ps(x + 8), p);
          p = _mm256_fmadd_ps(v[2], _mm256_loadu_ps(x + 16), p);
          part[m] = _mm256_fmadd_ps(v[3], _mm256_loadu_ps(x + 24), p);
        }
      }
      const __m256 sv = _mm256_set1_ps(s);
      const float c = z - 8.0f * s;
      for (int m = 0; m < M; ++m) {
        acc[m] = _mm256_fmadd_ps(part[m], sv, acc[m]);
        corr[m] += c * xsum[m * groups + g];
      }
    }
    for (int m = 0; m < M; ++m) y[m * ldy + n] = hsum(acc[m]) + corr[m];
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

// Rows [n0, n1) dequantized into out [(n1 - n0), K] fp32: (v - 8) * s + z, one FMA (the product exact).
template <int Kind>
void dequantize(const uint8_t* q, const void* scale, const void* zero, int64_t K, int64_t group, int64_t n0,
                int64_t n1, float* out) {
  const int64_t groups = K / group, row_bytes = K / 2;
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int64_t n = n0; n < n1; ++n) {
    float* o = out + (n - n0) * K;
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 sv = _mm256_set1_ps(scale_at<Kind>(scale, n * groups + g));
      const __m256 zv = _mm256_set1_ps(zero == nullptr ? 0.0f : scale_at<Kind>(zero, n * groups + g));
      for (int64_t k = g * group; k < (g + 1) * group; k += 32) {
        __m256 v[4];
        chunk_values(q + n * row_bytes + k / 2, v);
        for (int j = 0; j < 4; ++j) _mm256_storeu_ps(o + k + 8 * j, _mm256_fmadd_ps(_mm256_sub_ps(v[j], eight), sv, zv));
      }
    }
  }
}

}  // namespace

// As int4_dot_rows_avx512 (int4_linear.cpp declares both): rows (<= 4) of fp32 x and their groups' sums against int4
// rows [n0, n1) of q, fp32 sums into y[m * ldy + n].
void int4_dot_rows_avx2(const float* xf, const float* xsum, int64_t rows, const uint8_t* q, const void* scale,
                        const void* zero, int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  switch (scale_kind) {
    case 0: return dot<0>(xf, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    case 1: return dot<1>(xf, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
    default: return dot<2>(xf, xsum, rows, q, scale, zero, K, group, n0, n1, y, ldy);
  }
}

// fp32 -> bf16, rounded to nearest even as ATen's conversion (finite values: the weights'), 16 at a time.
void fp32_to_bf16_avx2(const float* in, int64_t n, uint16_t* out) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF);
  auto round = [&](__m256i a) {
    return _mm256_srli_epi32(_mm256_add_epi32(a, _mm256_add_epi32(bias, _mm256_and_si256(_mm256_srli_epi32(a, 16), one))),
                             16);
  };
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = round(_mm256_castps_si256(_mm256_loadu_ps(in + i)));
    const __m256i b = round(_mm256_castps_si256(_mm256_loadu_ps(in + i + 8)));
    // packus works within 128-bit lanes: [a0-3, b0-3, a4-7, b4-7] -> a0-7, b0-7.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8));
  }
  for (; i < n; ++i) {
    uint32_t bits;
    __builtin_memcpy(&bits, in + i, 4);
    out[i] = static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
}

void int4_dequantize_rows_avx2(const uint8_t* q, const void* scale, const void* zero, int scale_kind, int64_t K,
                               int64_t group, int64_t n0, int64_t n1, float* out) {
  switch (scale_kind) {
    case 0: return dequantize<0>(q, scale, zero, K, group, n0, n1, out);
    case 1: return dequantize<1>(q, scale, zero, K, group, n0, n1, out);
    default: return dequantize<2>(q, scale, zero, K, group, n0, n1, out);
  }
}

}  // namespace dtensor::detail
