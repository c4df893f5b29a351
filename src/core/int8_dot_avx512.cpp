// int8_dot_rows.h's loop in 512-bit vectors (16 weights a vector, a cache line a step): compiled with -mavx512f alone in
// its file. Half the instructions per weight of the AVX2 loop, which at 4 rows of x no longer kept up with the memory.
#include "core/int8_dot_rows.h"

namespace dtensor::detail {
namespace {

struct Avx512 {
  static constexpr int64_t kWidth = 16;
  using type = __m512;
  static type zero() { return _mm512_setzero_ps(); }
  static type widen(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static type load(const float* p) { return _mm512_loadu_ps(p); }
  static type fma(type a, type b, type acc) { return _mm512_fmadd_ps(a, b, acc); }
  static type add(type a, type b) { return _mm512_add_ps(a, b); }
  static float sum(type v) { return _mm512_reduce_add_ps(v); }
};

}  // namespace

void int8_dot_rows_avx512(const float* xf, int64_t rows, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y,
                          int64_t ldy) {
  int8_dot::dot<Avx512>(xf, rows, q, K, n0, n1, y, ldy);
}

}  // namespace dtensor::detail
