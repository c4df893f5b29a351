// float8::widen's inner loop (src/float8/float8_matmul.h) with AVX2 + F16C: compiled alone in its file with those
// flags, entered only after float8_matmul.cpp checked the CPU. Raw pointers, no LibTorch.
//
// A float8 byte is an fp16 value's bits shifted: e5m2 is the high byte of fp16 exactly; e4m3fn's sign, 4 exponent and
// 3 mantissa bits, moved to fp16's places (sign << 8, the rest << 7), are an fp16 value 2^8 times too small (the
// exponent biases are 7 and 15), subnormals included (an e4m3fn subnormal is an fp16 subnormal times 2^8). vcvtph2ps
// widens 8 of them to fp32 exactly, and bf16 is fp32's high half (exact: at most 3 mantissa bits). e4m3fn's NaN
// (magnitude 0x7F) is the one byte whose fp16 reading is a finite number: blended in. 16 bytes a step.
#include <immintrin.h>

#include <cstdint>

namespace dtensor::float8::detail {

int64_t widen_avx2(const uint8_t* in, int64_t n, bool e4m3, float nan_pos, float nan_neg, float* out32,
                   uint16_t* out16) {
  const int64_t full = n / 16 * 16;
  const __m256i sign = _mm256_set1_epi16(0x80), magnitude = _mm256_set1_epi16(0x7F), neg_nan = _mm256_set1_epi16(0xFF);
  const __m256 two8 = _mm256_set1_ps(256.0f), pos = _mm256_set1_ps(nan_pos), neg = _mm256_set1_ps(nan_neg);
  for (int64_t i = 0; i < full; i += 16) {
    const __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256i h = e4m3 ? _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, sign), 8),
                                             _mm256_slli_epi16(_mm256_and_si256(b, magnitude), 7))
                           : _mm256_slli_epi16(b, 8);
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if (e4m3) {
      lo = _mm256_mul_ps(lo, two8);
      hi = _mm256_mul_ps(hi, two8);
      const __m256i is_nan = _mm256_cmpeq_epi16(_mm256_and_si256(b, magnitude), magnitude);
      if (!_mm256_testz_si256(is_nan, is_nan)) {
        const __m256i is_neg = _mm256_cmpeq_epi16(b, neg_nan);
        auto blend = [&](__m256 v, __m128i nan16, __m128i neg16) {
          const __m256 nan32 = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(nan16));
          const __m256 value = _mm256_blendv_ps(pos, neg, _mm256_castsi256_ps(_mm256_cvtepi16_epi32(neg16)));
          return _mm256_blendv_ps(v, value, nan32);
        };
        lo = blend(lo, _mm256_castsi256_si128(is_nan), _mm256_castsi256_si128(is_neg));
        hi = blend(hi, _mm256_extracti128_si256(is_nan, 1), _mm256_extracti128_si256(is_neg, 1));
      }
    }
    if (out32 != nullptr) {
      _mm256_storeu_ps(out32 + i, lo);
      _mm256_storeu_ps(out32 + i + 8, hi);
    } else {
      // fp32's high halves, packed in order (packus works per 128-bit lane: the permute restores the order).
      const __m256i l = _mm256_srli_epi32(_mm256_castps_si256(lo), 16), u = _mm256_srli_epi32(_mm256_castps_si256(hi), 16);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out16 + i),
                          _mm256_permute4x64_epi64(_mm256_packus_epi32(l, u), 0xD8));
    }
  }
  return full;
}

}  // namespace dtensor::float8::detail
