// dtensor::int4_weight_linear (fast_kernels.h): weight-only int4 (dtensor/quant/int4_weight_only.h's layout) on the
// CPU. Few rows of x (up to 16): the fused kernel (int4_dot_avx512.cpp; on CPUs without AVX-512, int4_dot_avx2.cpp)
// streams the packed weights once, half a byte a weight plus the group's scales. More bf16 rows (a prefill) on a CPU
// without AVX-512 BF16: blocks of the weight dequantized into bf16 in L2 for bf16_linear's kernel (filled_linear.h).
// More rows elsewhere: blocks of rows dequantized into x's dtype (the kernel's exact fp32 weights, then
// rounded as the reference rounds them) and PyTorch's matmul over each block.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <vector>

#include "dtensor/core/fast_kernels.h"
#include "core/filled_linear.h"

namespace dtensor {
namespace detail {
void int4_dot_rows_avx512(const float* xf, const float* xsum, int64_t rows, const uint8_t* q, const void* scale,
                          const void* zero, int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1, float* y,
                          int64_t ldy);
void int4_dot_rows_avx512bf16(const uint16_t* xp, const float* xsum, int64_t rows, const uint8_t* q, const void* scale,
                              const void* zero, int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1,
                              float* y, int64_t ldy);
void int4_dequantize_rows_avx512(const uint8_t* q, const void* scale, const void* zero, int scale_kind, int64_t K,
                                 int64_t group, int64_t n0, int64_t n1, float* out);
void int4_dot_rows_avx2(const float* xf, const float* xsum, int64_t rows, const uint8_t* q, const void* scale,
                        const void* zero, int scale_kind, int64_t K, int64_t group, int64_t n0, int64_t n1, float* y,
                        int64_t ldy);
void int4_dequantize_rows_avx2(const uint8_t* q, const void* scale, const void* zero, int scale_kind, int64_t K,
                               int64_t group, int64_t n0, int64_t n1, float* out);
void fp32_to_bf16_avx2(const float* in, int64_t n, uint16_t* out);
}  // namespace detail

namespace {

// The kernels' CPU: AVX-512F (+ F16C), else AVX2 + FMA + F16C (int4_dot_avx2.cpp), else none.
bool has_avx512() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("f16c");
  return ok;
}
bool has_avx2() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

// The fp32 dot-product and dequantization loops of this CPU, chosen once.
struct Fp32Kernels {
  decltype(&detail::int4_dot_rows_avx2) dot;
  decltype(&detail::int4_dequantize_rows_avx2) dequantize;
};
const Fp32Kernels& fp32_kernels() {
  static const Fp32Kernels k = has_avx512()
                                   ? Fp32Kernels{detail::int4_dot_rows_avx512, detail::int4_dequantize_rows_avx512}
                                   : Fp32Kernels{detail::int4_dot_rows_avx2, detail::int4_dequantize_rows_avx2};
  return k;
}

// Rows of x up to which the fused kernel runs (4 at a time over each block of weights while it is in cache); above,
// each block of weights is dequantized once for all rows and PyTorch's matmul runs over it.
constexpr int64_t kInt4FusedMaxRows = 16;
// Weight rows dequantized at a time on the blocked path (each block one matmul).
constexpr int64_t kInt4BlockRows = 512;
// bf16 rows of x from which, on a CPU without AVX-512 BF16, the weights are dequantized block by block for the bf16
// kernel instead of PyTorch's matmul over dequantized blocks (18 GFLOP/s there). Measured on Zen 3 (2026-12-04,
// bf16_linear_bench, 1B shapes): from 4 to 8 rows the fused kernel took 0.55-0.65x the blocked path's time (the
// dequantization into bf16 costs more than the fused kernel's widening per 4 rows); at 16 they were even; at 64 the
// blocked path took 25 ms against ~120 for PyTorch's matmul.
constexpr int64_t kInt4WidenMinRows = kInt4FusedMaxRows + 1;

int scale_kind(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0;
    case at::kBFloat16: return 1;
    case at::kHalf: return 2;
    default: return -1;
  }
}

// Rows [n0, n1) of the weight as fp32 [n1 - n0, K]: (v - 8) * s + z, the fused kernel's values, threads splitting rows.
void dequantize_rows(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& zero, int kind, int64_t K,
                     int64_t group, int64_t n0, int64_t n1, float* out) {
  const void* zp = zero.defined() ? zero.data_ptr() : nullptr;
  at::parallel_for(n0, n1, 16, [&](int64_t r0, int64_t r1) {
    fp32_kernels().dequantize(q.data_ptr<uint8_t>(), scale.data_ptr(), zp, kind, K, group, r0, r1, out + (r0 - n0) * K);
  });
}

}  // namespace

bool int4_weight_linear_available() { return (has_avx512() || has_avx2()) && fast_kernels_enabled(); }

std::optional<at::Tensor> int4_weight_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                                             const at::Tensor& zero, int64_t group) {
  if (!int4_weight_linear_available()) return std::nullopt;
  if (x.dim() != 2 || q.dim() != 2 || scale.dim() != 2 || q.scalar_type() != at::kByte) return std::nullopt;
  if (x.scalar_type() != at::kBFloat16 && x.scalar_type() != at::kFloat) return std::nullopt;
  const int64_t M = x.size(0), K = x.size(1), N = q.size(0);
  if (M == 0 || K == 0 || group <= 0 || K != 2 * q.size(1) || K % group != 0 || group % 32 != 0) {
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
  // bf16 x on a CPU with AVX-512 BF16: the bf16 dot-product kernel, x in its order (per 64 values: the low nibbles'
  // 32, x[0..15] and x[32..47], then the high ones'); else the fp32 kernel on x in fp32 (exact).
  static const bool bf16_dot = has_avx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  // bf16 x from kInt4WidenMinRows rows on a CPU without AVX-512 BF16: the weight's blocks dequantized into bf16 (the
  // reference's weights: fp32 (v - 8) * s + z, rounded to bf16 as the reference rounds them) in L2, bf16_linear's
  // kernel over each (filled_linear.h): the dequantization paid once a weight, not once a row of x.
  if (!bf16_dot && x.scalar_type() == at::kBFloat16 && M >= kInt4WidenMinRows) {
    const at::Tensor xc = x.contiguous();
    at::Tensor y = at::empty({M, N}, x.options().dtype(at::kFloat));
    const uint8_t* qp = q.data_ptr<uint8_t>();
    const void* sp = scale.data_ptr();
    const void* zp = zero.defined() ? zero.data_ptr() : nullptr;
    const auto fill = [&](int64_t n0, int64_t n1, uint16_t* out) {
      thread_local std::vector<float> rows;  // this thread's block in fp32
      rows.resize(static_cast<size_t>((n1 - n0) * K));
      fp32_kernels().dequantize(qp, sp, zp, kind, K, group, n0, n1, rows.data());
      detail::fp32_to_bf16_avx2(rows.data(), (n1 - n0) * K, out);
    };
    if (detail::bf16_linear_filled(xc, N, fill, y.data_ptr<float>())) return y.to(at::kBFloat16);  // one rounding
  }
  if (M > kInt4FusedMaxRows) {
    at::Tensor y = at::empty({M, N}, x.options());
    const at::Tensor block = at::empty({std::min(N, kInt4BlockRows), K}, x.options().dtype(at::kFloat));
    for (int64_t n0 = 0; n0 < N; n0 += kInt4BlockRows) {
      const int64_t n1 = std::min(N, n0 + kInt4BlockRows);
      dequantize_rows(q, scale, zero, kind, K, group, n0, n1, block.data_ptr<float>());
      y.narrow(1, n0, n1 - n0).copy_(at::mm(x, block.narrow(0, 0, n1 - n0).to(x.scalar_type()).t()));
    }
    return y;
  }

  const bool use_bf16 = bf16_dot && x.scalar_type() == at::kBFloat16 && K % 64 == 0;
  const at::Tensor xc = x.contiguous();
  const at::Tensor xf = use_bf16 ? at::Tensor() : xc.to(at::kFloat);
  const at::Tensor xp = use_bf16 ? xc.view({M, K / 64, 2, 2, 16}).transpose(2, 3).contiguous().view({M, K}) : at::Tensor();
  // Each group's sum of x, in fp32.
  const at::Tensor xs = xc.view({M, K / group, group}).sum(-1, /*keepdim=*/false, at::kFloat).contiguous();
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
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int64_t r = std::min<int64_t>(4, M - m0);
        const float* xsm = xs.data_ptr<float>() + m0 * (K / group);
        if (use_bf16) {
          detail::int4_dot_rows_avx512bf16(reinterpret_cast<const uint16_t*>(xp.data_ptr<at::BFloat16>()) + m0 * K, xsm,
                                           r, qp, sp, zp, kind, K, group, n0, n1, yp + m0 * N, N);
        } else {
          fp32_kernels().dot(xf.data_ptr<float>() + m0 * K, xsm, r, qp, sp, zp, kind, K, group, n0, n1, yp + m0 * N, N);
        }
      }
    }
  });
  return x.scalar_type() == at::kFloat ? y : y.to(x.scalar_type());  // one rounding
}

}  // namespace dtensor
