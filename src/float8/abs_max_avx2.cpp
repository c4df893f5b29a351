// float8::abs_max's inner loop over all of a dense fp32 or bf16 buffer with AVX2 (include/dtensor/float8/
// float8_linear.h): compiled alone in its file with those flags, entered only after float8_linear.cpp checked the CPU
// (float8::has_vector_casts). Raw pointers, no LibTorch.
//
// On the bits: with the sign bit cleared, |v|'s bits order as integers do for every value that is not a NaN, and every
// NaN's bits lie above infinity's. So the integer max of the cleared bits is the bits of max |v| (a NaN if any value is
// one), one AND and one MAX a vector where aminmax compares twice and then negates; signed lanes are enough, the
// cleared bits being non-negative.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace dtensor::float8::detail {

uint32_t abs_max_bits_fp32_avx2(const uint32_t* in, int64_t n) {
  const __m256i clear_sign = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a = _mm256_max_epi32(a, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), clear_sign));
    b = _mm256_max_epi32(b, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8)), clear_sign));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epi32(a, b));
  uint32_t m = *std::max_element(lanes, lanes + 8);
  for (; i < n; ++i) m = std::max(m, in[i] & 0x7FFFFFFFu);
  return m;
}

uint16_t abs_max_bits_bf16_avx2(const uint16_t* in, int64_t n) {
  const __m256i clear_sign = _mm256_set1_epi16(0x7FFF);
  __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = _mm256_max_epi16(a, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)), clear_sign));
    b = _mm256_max_epi16(b, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 16)), clear_sign));
  }
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_max_epi16(a, b));
  uint16_t m = *std::max_element(lanes, lanes + 16);
  for (; i < n; ++i) m = std::max<uint16_t>(m, in[i] & 0x7FFF);
  return m;
}

}  // namespace dtensor::float8::detail
