// The weight-only int8 inner loop of dtensor::int8_weight_linear (fast_kernels.h) for few rows of x, written once over
// a vector type V and included by the two files that compile it for their instruction sets (int8_dot_avx2.cpp,
// int8_dot_avx512.cpp; each entered only after fast_kernels.cpp checked the CPU). Raw pointers, no LibTorch.
//
// The int8 weights are widened in registers as they stream in (V::kWidth bytes sign-extended to 32-bit lanes,
// converted to fp32: exact) and multiplied with x already in fp32 (its bf16 values, exact): each product is exact in
// fp32, the sums are fp32, as the bf16 kernels'. Three instructions a weight vector at one row of x, against the ten
// of widening into a buffer first and reading it again: at a decode step's few rows the int8 bytes stream at the
// memory's rate.
//
// V: kWidth (fp32 lanes), type, zero(), widen(const int8_t*), load(const float*), fma(a, b, acc), add(a, b),
// sum(v).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail::int8_dot {

// y[m * ldy + n] = sum_k xf[m * K + k] * q[n * K + k] for m < M, n in [n0, n1): q's rows read in order (one stream a
// thread), four accumulators a row of x keep the sums independent; K's tail (K % kWidth) in scalar code.
template <class V, int M>
void dot_rows(const float* xf, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int U = 4;              // vectors per step
  constexpr int64_t W = V::kWidth;
  constexpr int64_t kAhead = 2048;  // bytes of q prefetched ahead (across page boundaries)
  const int64_t steps = K / (W * U) * (W * U), full = K / W * W;
  for (int64_t n = n0; n < n1; ++n) {
    const int8_t* row = q + n * K;
    typename V::type acc[M][U];
    for (int m = 0; m < M; ++m) {
      for (int u = 0; u < U; ++u) acc[m][u] = V::zero();
    }
    int64_t k = 0;
    for (; k < steps; k += W * U) {
      if ((k & 63) == 0) _mm_prefetch(reinterpret_cast<const char*>(row + k + kAhead), _MM_HINT_T0);
      for (int u = 0; u < U; ++u) {
        const auto w = V::widen(row + k + W * u);
        for (int m = 0; m < M; ++m) acc[m][u] = V::fma(V::load(xf + m * K + k + W * u), w, acc[m][u]);
      }
    }
    for (; k < full; k += W) {
      const auto w = V::widen(row + k);
      for (int m = 0; m < M; ++m) acc[m][0] = V::fma(V::load(xf + m * K + k), w, acc[m][0]);
    }
    for (int m = 0; m < M; ++m) {
      float s = V::sum(V::add(V::add(acc[m][0], acc[m][1]), V::add(acc[m][2], acc[m][3])));
      for (int64_t t = full; t < K; ++t) s += xf[m * K + t] * static_cast<float>(row[t]);
      y[m * ldy + n] = s;
    }
  }
}

// Rows 1..4 of x (more: the caller's chunks of 4).
template <class V>
void dot(const float* xf, int64_t rows, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  switch (rows) {
    case 1: return dot_rows<V, 1>(xf, q, K, n0, n1, y, ldy);
    case 2: return dot_rows<V, 2>(xf, q, K, n0, n1, y, ldy);
    case 3: return dot_rows<V, 3>(xf, q, K, n0, n1, y, ldy);
    default: return dot_rows<V, 4>(xf, q, K, n0, n1, y, ldy);
  }
}

}  // namespace dtensor::detail::int8_dot
