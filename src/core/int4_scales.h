// The group scales of the int4 kernels (int4_dot_avx512.cpp, int4_dot_avx512bf16.cpp), read into fp32 from their
// storage: 0 fp32, 1 bf16, 2 fp16 (int4_linear.cpp's scale_kind). Included only by files compiled with -mavx512f -mf16c.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail {
namespace {

// A scale's storage (int4_linear.cpp's ScaleKind): 0 fp32, 1 bf16, 2 fp16.
template <int Kind>
inline float scale_at(const void* p, int64_t i) {
  if constexpr (Kind == 0) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (Kind == 1) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  } else {
    return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  }
}

// `count` (<= 16) scales from index i into fp32: one vector conversion for 16.
template <int Kind>
inline void scales_at(const void* p, int64_t i, int64_t count, float* out) {
  if (count == 16 && Kind == 2) {
    _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                              static_cast<const uint16_t*>(p) + i))));
  } else if (count == 16 && Kind == 1) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
        static_cast<const uint16_t*>(p) + i)));
    _mm512_storeu_ps(out, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
  } else {
    for (int64_t j = 0; j < count; ++j) out[j] = scale_at<Kind>(p, i + j);
  }
}

}  // namespace
}  // namespace dtensor::detail
