// bf16_linear's blocked kernels (fast_kernels.cpp) over weights stored in another form: the weight's rows are made in
// bf16 a block at a time (~128 KB, L2's share) by the caller's fill, and every row of x runs over the block while it
// is in cache, so the stored form streams from memory once whatever the number of rows. The int8 and int4 weight-only
// linears use it above the rows where their fused kernels stop paying (int4_linear.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>

namespace dtensor::detail {

// Writes rows [n0, n1) of the weight [N, K] as bf16 into out [(n1 - n0) * K]; runs on the calling thread (inside
// the kernels' parallel_for: it must not start one).
using BlockFill = std::function<void(int64_t n0, int64_t n1, uint16_t* out)>;

// y [M, N] fp32 = x . w^T for bf16 x [M, K] (contiguous, on the CPU), w's rows from `fill`, through this CPU's
// bf16_linear kernel (any number of rows). false, y untouched, where none runs (no kernel, fast kernels off).
bool bf16_linear_filled(const at::Tensor& x, int64_t N, const BlockFill& fill, float* y);

}  // namespace dtensor::detail
