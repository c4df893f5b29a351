// CPU fast paths beside PyTorch's kernels, each with its reference (the PyTorch op it replaces) and a switch.
//
// bf16_linear: y = x w^T for bf16 x [M, K] with few rows (decode's batch, a short prefill) and a contiguous bf16 weight
// w [N, K], the product of each row pair accumulated in fp32 over w's rows as they lie in memory, threads splitting
// the rows of w: the weights are streamed once, at the memory's read bandwidth (PyTorch's bf16 path copies the
// transposed weight into a buffer first). Three kernels, the CPU's chosen once: AMX-BF16 tiles (M 2..32, 16 rows of w
// as they lie are a tile; x packed into tiles per call; one row by AVX-512 BF16), AVX-512 BF16 dot products
// (vdpbf16ps, M <= 16; from 4 rows a 4 x 4 register tile of rows of x and of w), or AVX2 + FMA on fp32 (bf16 widened by a shift; any M, w in L2-sized blocks that every 4-row
// chunk of x runs over). Each row limit is where the kernel stopped beating PyTorch's GEMM when measured on that CPU kind. The
// result is rounded to bf16 once, as PyTorch's (which also accumulates in fp32), but the sums' order differs: equal to
// at::linear within one bf16 rounding.
// Used by dtensor::nn::Linear on plain tensors and by the DTensor kernel for the local aten::mm of a sharded linear.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace dtensor {

// Whether the fast paths run (default: yes, where the CPU has AMX-BF16, AVX-512 BF16 or AVX2 + FMA;
// DTENSOR_FAST_KERNELS=0 turns them off).
bool fast_kernels_enabled();
// bf16_linear's kernel on this CPU: "amx_bf16", "avx512_bf16", "avx2_fma", "none" (PyTorch's op runs), or "off"
// (switched off).
const char* bf16_linear_kernel();
// The most rows of x it takes here (0: none; kAnyRows: any number).
inline constexpr int64_t kAnyRows = INT64_MAX;
int64_t bf16_linear_max_rows();
// Turns them off (the reference paths: PyTorch's kernels) while alive, for every thread; restores the old setting.
struct FastKernelsGuard {
  explicit FastKernelsGuard(bool enabled);
  ~FastKernelsGuard();
  FastKernelsGuard(const FastKernelsGuard&) = delete;
  FastKernelsGuard& operator=(const FastKernelsGuard&) = delete;

 private:
  bool previous_;
};

// x [M, K] (any strides along M, contiguous rows) times w^T, w [N, K] contiguous, both bf16 on the CPU, M <=
// bf16_linear_max_rows(), no autograd: [M, N] in bf16 (or fp32 with `fp32_out`, the sums before rounding). nullopt
// where it does not apply (other dtypes or layouts, more rows, a CPU with neither kernel, fast kernels off): the caller
// runs PyTorch's op.
std::optional<at::Tensor> bf16_linear(const at::Tensor& x, const at::Tensor& w, bool fp32_out = false);

// int8_weight_linear: y = (x q^T) * scale, weight-only int8 (dtensor/quant/int8_weight_only.h), for bf16 x [M, K] (any
// M), a contiguous int8 q [N, K] and fp32 scale [N], on the CPU, no autograd: each block of q's rows is widened to
// bf16 (exact) into a buffer that stays in L2 and bf16_linear's kernel runs over it, so q streams from memory once at
// a byte a weight; bf16(scale[n] * fp32 sums), one rounding. nullopt where it does not apply (as bf16_linear, but for
// the row count): the caller runs the reference, mm(x, q^T in x's dtype) * scale.
std::optional<at::Tensor> int8_weight_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale);

// int4_weight_linear: y = x w^T, w the group-wise int4 weight of dtensor/quant/int4_weight_only.h (q uint8 [N, K / 2]
// packed, scale and zero [N, K / group] in fp32, bf16 or fp16, zero undefined for 0), for bf16 or fp32 x [M, K] on
// a CPU with AVX-512F or AVX2 + FMA + F16C, no autograd (src/core/int4_linear.cpp). Up to 16 rows of x: a fused kernel streams q once (4
// rows of x at a time over each block of q while it is in cache), each group's sum of v * x (exact products, fp32
// sums) times its scale, plus (z - 8 s) times the group's sum of x; one rounding to x's dtype. More rows: blocks of
// w dequantized into x's dtype and PyTorch's matmul. Equal to the reference within fp32 rounding (then x's dtype's).
// nullopt where it does not apply (other dtypes or layouts, a group size not a multiple of 32, neither CPU kind, fast
// kernels off): the caller runs the reference, mm(x, dequantized w^T in x's dtype).
std::optional<at::Tensor> int4_weight_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale,
                                             const at::Tensor& zero, int64_t group);
// Whether int4_weight_linear's kernels run here (AVX-512F with F16C, or AVX2 + FMA + F16C; fast kernels on).
bool int4_weight_linear_available();

}  // namespace dtensor
