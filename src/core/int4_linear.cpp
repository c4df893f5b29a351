// dtensor::int4_weight_linear (fast_kernels.h): weight-only int4 (dtensor/quant/int4_weight_only.h's layout) on the
// CPU. Few rows of x: the fused AVX-512 kernel (int4_dot_avx512.cpp) streams the packed weights once, half a byte a
// weight plus the group's scales; more rows (a prefill): blocks of rows dequantized into x's dtype (the kernel's
// exact fp32 weights, then rounded as the reference rounds them) and PyTorch's matmul over each block.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cstring>

#include "dtensor/core/fast_kernels.h"

namespace dtensor {
namespace detail {
void int4_dot_rows_avx512(const float* xf, int64_t rows, const uint8_t* q, const void* scale, const void* zero,
                          int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1, float* y, int64_t ldy);
}  // namespace detail

namespace {

// Rows of x up to which the fused kernel runs; above, each block of weights is dequantized once for all rows. Chosen,
// not measured: at 4 rows the fused loop's 4 FMAs a chunk and row still share one unpacking.
constexpr int64_t kInt4FusedMaxRows = 4;
// Weight rows dequantized at a time on the blocked path (each block one matmul).
constexpr int64_t kInt4BlockRows = 512;

int scale_kind(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    default: return -1;
  }
}

float scale_value(const at::Tensor& s, int64_t i) {
  switch (s.scalar_type()) {
    case at::kFloat: return s.data_ptr<float>()[i];
    case at::kBFloat16: return static_cast<float>(s.data_ptr<at::BFloat16>()[i]);
    default: return static_cast<float>(s.data_ptr<at::Half>()[i]);
  }
}

// Rows [n0, n1) of the weight as fp32 [n1 - n0, K]: (v - 8) * s + z, the kernel's values.
void dequantize_rows(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& zero, int64_t K, int64_t group,
                     int64_t n0, int64_t n1, float* out) {
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const int64_t groups = K / group;
  at::parallel_for(n0, n1, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      const uint8_t* row = qp + n * (K / 2);
      float* o = out + (n - n0) * K;
      for (int64_t g = 0; g < groups; ++g) {
        const float s = scale_value(scale, n * groups + g), z = zero.defined() ? scale_value(zero, n * groups + g) : 0;
        float table[16];
        for (int v = 0; v < 16; ++v) table[v] = static_cast<float>(v - 8) * s + z;
        for (int64_t c = g * group; c < (g + 1) * group; c += 32) {
          for (int j = 0; j < 16; ++j) {
            const uint8_t b = row[c / 2 + j];
            o[c + j] = table[b & 15];
            o[c + j + 16] = table[b >> 4];
          }
        }
      }
    }
  });
}

}  // namespace

std::optional<at::Tensor> int4_weight_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                                             const at::Tensor& zero, int64_t group) {
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c");
  if (!fast_kernels_enabled() || !avx512) return std::nullopt;
  if (x.dim() != 2 || q.dim() != 2 || scale.dim() != 2 || q.scalar_type() != at::kByte) return std::nullopt;
  if (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kFloat) return std::nullopt;
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  if (M == 0 || K == 0 || group <= 0 || K != 2 * q.size(1) || K % group != 0 || (group != 32 && group % 64 != 0)) {
    return std::nullopt;
  }
  const int kind = scale_kind(scale.scalar_type());
  if (kind < 0 || scale.size(0) != N || scale.size(1) != K / group || !scale.is_contiguous() || !q.is_contiguous()) {
    return std::nullopt;
  }
  if (zero.defined() && (zero.scalar_type() != scale.scalar_type() || zero.sizes() != scale.sizes() ||
                         !zero.is_contiguous())) {
    return std::nullopt;
  }
  for (const at::Tensor* t : {&x, &q, &scale}) {
    if (!t->device().is_cpu()) return std::nullopt;
  }
  if (x.requires_grad() && c10::GradMode::is_enabled()) return std::nullopt;
  if (M > kInt4FusedMaxRows) {
    at::Tensor y = at::empty({M, N}, x.options());
    const at::Tensor block = at::empty({std::min(N, kInt4BlockRows), K}, x.options().dtype(at::kFloat));
    for (int64_t n0 = 0; n0 < N; n0 += kInt4BlockRows) {
      const int64_t n1 = std::min(N, n0 + kInt4BlockRows);
      dequantize_rows(q, scale, zero, K, group, n0, n1, block.data_ptr<float>());
      y.narrow(1, n0, n1 - n0).copy_(at::mm(x, block.narrow(0, 0, n1 - n0).to(x.scalar_type()).t()));
    }
    return y;
  }
  const at::Tensor xf = x.contiguous().to(at::kFloat);  // exact
  at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
  const uint8_t* qp = q.data_ptr<uint8_t>();
  const void* sp = scale.data_ptr();
  const void* zp = zero.defined() ? zero.data_ptr() : nullptr;
  float* yp = y.data_ptr<float>();
  // Threads split q into blocks of ~64 KB; every chunk of 4 rows of x runs over a block while it is in cache.
  const int64_t rows = std::max<int64_t>(1, (int64_t{64} << 10) / (K / 2)), blocks = (N + rows - 1) / rows;
  at::parallel_for(0, blocks, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * rows, n1 = std::min(N, n0 + rows);
      detail::int4_dot_rows_avx512(xf.data_ptr<float>(), M, qp, sp, zp, kind, K, group, n0, n1, yp, N);
    }
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());  // one rounding
}

}  // namespace dtensor
