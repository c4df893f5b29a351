// int8_dot_rows.h's loop in 256-bit vectors (8 weights a vector): compiled with -mavx2 -mfma alone in its file, for CPUs
// without AVX-512.
#include "core/int8_dot_rows.h"

namespace dtensor::detail {
namespace {

struct Avx2 {
  static constexpr int64_t kWidth = 8;
  using type = __m256;
  static type zero() { return _mm256_setzero_ps(); }
  static type widen(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static type load(const float* p) { return _mm256_loadu_ps(p); }
  static type fma(type a, type b, type acc) { return _mm256_fmadd_ps(a, b, acc); }
  static type add(type a, type b) { return _mm256_add_ps(a, b); }
  static float sum(type v) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
  }
};

}  // namespace

void int8_dot_rows_avx2(const float* xf, int64_t rows, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y,
                        int64_t ldy) {
  int8_dot::dot<Avx2>(xf, rows, q, K, n0, n1, y, ldy);
}

}  // namespace dtensor::detail
