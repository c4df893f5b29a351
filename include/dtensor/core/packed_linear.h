// bf16 Linear weights packed once (at load) for the AVX-512 BF16 GEMM: IPEX's weight prepack (ipex.optimize's
// weights_prepack), oneDNN's and vLLM's CPU way of running decode at batch without re-laying the weight every call.
//
// The packed weight: the same N * K bf16 values, in panels of 64 output rows of w, each panel [K / 2][64][2] (the
// pair w[n][2p], w[n][2p + 1] of each of the 64 rows for p = 0, 1, ...), held as a uint16 tensor of w's shape [N, K]
// so that no op mistakes it for the weight (uint16 has no arithmetic in ATen: any use but these functions fails).
// bf16_packed_linear streams it once, in order, for any number of rows of x: each 64-byte line is 16 rows of w's
// pair p, the B operand of vdpbf16ps as it lies, and a register tile of 6 rows of x by 64 columns feeds it from L1
// (src/core/bf16_packed_avx512.cpp). Measured on AMD EPYC Zen 5, 2 threads (docs/benchmarks.md, "Weights packed at
// load"): at the bandwidth at 1 row, 0.5-0.8x the time of PyTorch's oneDNN GEMM from 16 to 128 rows. On AMX CPUs the
// same layout is AMX's B operand as it lies (16 pairs of 16 columns, 256 bytes apart: one tile load), and from 4 rows
// of x the tiles would compute (src/core/bf16_packed_amx.cpp); packing is off there for now, since one row packed ran
// 1.5-2x slower than the unpacked dot kernel ("AMX over packed weights" in docs/benchmarks.md).
// The reference beside it: at::linear(x, bf16_unpack_weight(packed)).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dtensor {

// Whether the packed kernel runs here: a CPU whose bf16_linear kernel is "avx512_bf16" (not yet "amx_bf16": one row
// is slower packed there), fast kernels on (DTENSOR_FAST_KERNELS). Elsewhere bf16_packed_linear runs the reference.
bool bf16_packed_linear_available();
// Whether a weight [N, K] can be packed: N a multiple of 64, K of 32.
bool bf16_packable(int64_t N, int64_t K);
// w [N, K] bf16 (any strides) -> its packed form (uint16 [N, K], contiguous). Throws dtensor::Error naming the shape
// when bf16_packable is false, the dtype when it is not bf16.
at::Tensor bf16_pack_weight(const at::Tensor& w);
// The inverse: the weight as it was (bf16 [N, K]), bit for bit.
at::Tensor bf16_unpack_weight(const at::Tensor& packed);
// y = x w^T for bf16 x [..., K] and w packed: [..., N] in bf16, the fp32 sums rounded once (as at::linear; the sums'
// order differs). The packed kernel where it runs, else the reference. No autograd: a packed weight is for inference
// (x requiring grad under grad mode throws).
at::Tensor bf16_packed_linear(const at::Tensor& x, const at::Tensor& packed);
// Rows `ids` (integers, any shape) of a packed weight [N, K], as bf16 [*ids.shape, K], bit for bit the weight's rows:
// the embedding lookup of a weight tied to a packed lm_head (row n is panel n / 64's column n % 64, its K / 2 pairs
// 256 bytes apart). Throws dtensor::Error naming an id outside [0, N).
at::Tensor bf16_packed_rows(const at::Tensor& packed, const at::Tensor& ids);

}  // namespace dtensor
