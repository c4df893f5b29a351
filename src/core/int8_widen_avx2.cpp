// int8 weights widened to bf16 for dtensor::int8_weight_linear (fast_kernels.h): compiled with -mavx2 alone in its
// file, entered only after fast_kernels.cpp checked the CPU. Raw pointers, no LibTorch.
//
// An int8 value has at most 8 significant bits, so its fp32 value's upper half is its bf16 value exactly (no rounding):
// sign-extend 8 bytes to 32-bit lanes, convert, shift the halves down, pack.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace dtensor::detail {

void int8_to_bf16(const int8_t* q, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i));
    const __m256 lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    const __m256 hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
    const __m256i l = _mm256_srli_epi32(_mm256_castps_si256(lo), 16), h = _mm256_srli_epi32(_mm256_castps_si256(hi), 16);
    // packus interleaves 128-bit lanes (l0 h0 l1 h1): the permute puts them back in order (l0 l1 h0 h1).
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(l, h), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  for (; i < n; ++i) {
    const float f = static_cast<float>(q[i]);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
}

}  // namespace dtensor::detail
