// The group scales of the int4 kernels (int4_dot_avx512.cpp, int4_dot_avx512bf16.cpp), read into fp32 from their
// storage: 0 fp32, 1 bf16, 2 fp16 (int4_linear.cpp's scale_kind). Included only by files compiled with -mavx512f -mf16c.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "core/int4_scale_at.h"

namespace dtensor::detail {
namespace {

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

// The start of a block of up to 16 groups of a row (from group g0 of `groups`): their scales and zeros into sf, zf in
// fp32, the block's bytes of q prefetched ahead, and (z_g - bias s_g) times each row of x's sum over group g added to
// corr[m] (16 groups a vector; lanes past the row's groups count 0). Returns the block's group count.
template <int Kind, int M>
inline int64_t start_block(const void* scale, const void* zero, const uint8_t* block, int64_t n, int64_t groups,
                           int64_t g0, int64_t group, float bias, const float* xsum, float* sf, float* zf,
                           __m512 (&corr)[M]) {
  constexpr int64_t kAhead = 1024;  // bytes of q prefetched ahead
  const int64_t gn = std::min<int64_t>(16, groups - g0);
  scales_at<Kind>(scale, n * groups + g0, gn, sf);
  if (zero != nullptr) scales_at<Kind>(zero, n * groups + g0, gn, zf);
  for (int64_t b = 0; b < gn * group / 2; b += 64) _mm_prefetch(reinterpret_cast<const char*>(block + b + kAhead), _MM_HINT_T0);
  const __mmask16 live = static_cast<__mmask16>((1u << gn) - 1u);
  const __m512 c = _mm512_maskz_fmadd_ps(live, _mm512_set1_ps(-bias), _mm512_loadu_ps(sf), _mm512_loadu_ps(zf));
  for (int m = 0; m < M; ++m) corr[m] = _mm512_fmadd_ps(c, _mm512_maskz_loadu_ps(live, xsum + m * groups + g0), corr[m]);
  return gn;
}

}  // namespace
}  // namespace dtensor::detail
