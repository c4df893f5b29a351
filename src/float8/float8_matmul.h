// The float8 matmul of a converted layer, run one of three ways (Float8MatmulKind, include/dtensor/float8/
// float8_linear.h), and `auto` resolved by measuring them on the layer's shapes.
//
//   out = (a @ b) * inv_a * inv_b  in out_dtype,  a [M, K] and b [K, N] float8, inv_a / inv_b their scales' inverses
//   (scalars, or rowwise [M, 1] and [1, N]).
//
//   scaled_mm      at::_scaled_mm: the device's float8 GEMM (tensor cores on CUDA; on a CPU whatever PyTorch's build
//                  has: oneDNN's reference loop on some, a dequantizing fallback on others).
//   emulated       a and b widened to fp32 (exactly: every float8 value is an fp32 value) and scaled, then an fp32
//                  GEMM: bit for bit PyTorch's CPU _scaled_mm where that dequantizes (`_scaled_mm_out_cpu_emulated`),
//                  as torchao's emulate=True (which divides by the scale where this multiplies by its inverse).
//   emulated_bf16  a and b widened to bf16 (every float8 value is a bf16 value), a bf16 GEMM (the products exact,
//                  summed in fp32, the sum rounded to bf16 once), then the scales: within about one bf16 rounding of
//                  `emulated`. The fast one where bf16 GEMMs are (AVX-512 BF16, AMX).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dtensor/float8/float8_linear.h"

namespace dtensor {
class ProcessGroup;

namespace float8 {

// A float8 tensor widened to fp32 or bf16 exactly: 16 bytes a step through fp16's conversion (AVX2 + F16C: the bytes
// are fp16 bits shifted, widen_avx2.cpp), the rest, and every byte on other CPUs or with DTENSOR_FAST_KERNELS=0,
// through a 256-entry table (PyTorch's conversion runs per element, ~10x slower than the table); strides kept where
// the tensor is dense (a column-major operand stays column-major).
at::Tensor widen(const at::Tensor& f8, at::ScalarType dtype);

// Whether the CPU has the vector casts' instructions (AVX2 + F16C: widen_avx2.cpp, cast_avx2.cpp); with fast kernels
// on, widen and cast take them.
bool has_vector_casts();

// b of a float8 matmul must be column-major (_scaled_mm's rule): the memory of its transpose contiguous.
at::Tensor column_major(const at::Tensor& t);

// The matmul by `kind` (not auto).
at::Tensor matmul(Float8MatmulKind kind, const at::Tensor& a, const at::Tensor& b, const at::Tensor& inv_a,
                  const at::Tensor& inv_b, at::ScalarType out_dtype);

// `kind`, or for auto the fastest kind for a layer whose forward is x [M, K] @ w^T [K, N] (its backward's two matmuls
// timed with it), measured once per shape class (M, K, N rounded up to powers of two, the device, the dtype) and cached
// for the process. `key` names the class where ranks must agree (the global shapes and the layout; empty: the local
// shapes); `agree` are the groups whose ranks must pick alike: their timings are summed over each (an all-reduce, made
// by every rank of them at the same layer's first call) so that replicated results stay bit-identical.
Float8MatmulKind resolve(Float8MatmulKind kind, int64_t m, int64_t k, int64_t n, const at::TensorOptions& options,
                         const std::string& key, const std::vector<ProcessGroup*>& agree);

}  // namespace float8
}  // namespace dtensor
