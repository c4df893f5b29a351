// float8::cast's inner loop for one scale (include/dtensor/float8/float8_linear.h) with AVX2: compiled alone in its
// file with those flags, entered only after float8_linear.cpp checked the CPU (float8::has_vector_casts). Raw
// pointers, no LibTorch.
//
// The same arithmetic as the reference (fp32 x * scale, clamped to +-max, then c10's round-to-nearest-even
// conversion), 8 values a step in one pass instead of four (widen, scale, clamp, convert, each a buffer):
//   normal results (|v| >= the format's smallest normal): fp32's bits rounded to the format's mantissa bits by
//     adding half an ulp less one plus the kept part's lowest bit, the exponent rebiased;
//   subnormal results: |v| times 2^(mantissa bits - min exponent) rounded to an integer (vcvtps2dq: nearest-even),
//     which is the byte itself (its exponent field 0; a rounding up to the smallest normal gives that normal's byte).
// A step holding a NaN is left to the caller (the reference converts NaN with its sign); returns the values done.
#include <immintrin.h>

#include <cstdint>

namespace dtensor::float8::detail {
namespace {

// e4m3fn: 3 mantissa bits, bias 7, smallest normal 2^-6; e5m2: 2, 15, 2^-14.
struct Format {
  int mantissa_bits;
  int bias;
  float smallest_normal;
  float subnormal_scale;  // 2^(mantissa_bits + bias - 1): the subnormal quantum's inverse
  float max;
};
constexpr Format kE4m3{3, 7, 0x1p-6f, 0x1p9f, 448.0f};
constexpr Format kE5m2{2, 15, 0x1p-14f, 0x1p16f, 57344.0f};

template <bool kBf16In>
int64_t cast_impl(const void* in, int64_t n, float scale, const Format& f, uint8_t* out) {
  const int drop = 23 - f.mantissa_bits;
  const __m256 vscale = _mm256_set1_ps(scale), hi = _mm256_set1_ps(f.max), lo = _mm256_set1_ps(-f.max);
  const __m256 smallest = _mm256_set1_ps(f.smallest_normal), sub_scale = _mm256_set1_ps(f.subnormal_scale);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF), half_less_one = _mm256_set1_epi32((1 << (drop - 1)) - 1);
  const __m256i one = _mm256_set1_epi32(1), rebias = _mm256_set1_epi32((127 - f.bias) << f.mantissa_bits);
  const __m128i bytes_in_order = _mm_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v;
    if constexpr (kBf16In) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(in) + i));
      v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      v = _mm256_loadu_ps(static_cast<const float*>(in) + i);
    }
    v = _mm256_mul_ps(v, vscale);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) break;  // a NaN: the reference from here
    v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i sign = _mm256_srli_epi32(_mm256_andnot_si256(abs_mask, bits), 24);  // 0x80 or 0
    const __m256i mag = _mm256_and_si256(bits, abs_mask);
    const __m256 a = _mm256_castsi256_ps(mag);
    // Normal: round to nearest even at bit `drop`, then (exponent - 127 + bias) << mantissa_bits | mantissa.
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(mag, drop), one);
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(mag, half_less_one), odd);
    const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, drop), rebias);
    // Subnormal: the multiple of the quantum, nearest-even.
    const __m256i subnormal = _mm256_cvtps_epi32(_mm256_mul_ps(a, sub_scale));
    const __m256i byte = _mm256_or_si256(
        sign, _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(normal), _mm256_castsi256_ps(subnormal),
                                                   _mm256_cmp_ps(a, smallest, _CMP_LT_OQ))));
    // The low byte of each 32-bit lane, in order: 4 from each 128-bit half.
    const __m128i lo4 = _mm_shuffle_epi8(_mm256_castsi256_si128(byte), bytes_in_order);
    const __m128i hi4 = _mm_shuffle_epi8(_mm256_extracti128_si256(byte, 1), bytes_in_order);
    const uint64_t eight = static_cast<uint64_t>(static_cast<uint32_t>(_mm_cvtsi128_si32(lo4))) |
                           static_cast<uint64_t>(static_cast<uint32_t>(_mm_cvtsi128_si32(hi4))) << 32;
    __builtin_memcpy(out + i, &eight, 8);
  }
  return i;
}

}  // namespace

int64_t cast_avx2(const void* in, bool bf16_in, int64_t n, float scale, bool e4m3, uint8_t* out) {
  const Format& f = e4m3 ? kE4m3 : kE5m2;
  return bf16_in ? cast_impl<true>(in, n, scale, f, out) : cast_impl<false>(in, n, scale, f, out);
}

}  // namespace dtensor::float8::detail
