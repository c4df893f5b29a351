// One group scale of the int4 kernels read into fp32 from its storage: 0 fp32, 1 bf16, 2 fp16 (int4_linear.cpp's
// scale_kind). Included only by files compiled with F16C (-mf16c): int4_scales.h (AVX-512) and int4_dot_avx2.cpp.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail {
namespace {

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

}  // namespace
}  // namespace dtensor::detail
