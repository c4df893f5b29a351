// Element-wise reductions over the ranks' shared buffers: dst = src[0] op src[1] op ... op src[n-1], in rank
// order, so every rank that computes an element gets the same bits. bfloat16/float16 accumulate in float and
// round once. `dst` may alias any source (blocks are read before they are written).
//
// reduce_into is the fast path (plain loops the compiler vectorises); reduce_into_reference is the naive
// path through ATen ops that tests compare it with.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace dtensor::detail::shm {

enum class Reduction { SUM, MAX, MIN };

bool reducible(c10::ScalarType dtype);  // float32, float64, bfloat16, float16, int64

// `streaming`: write dst with non-temporal stores (stream_copy.h), for large outputs.
void reduce_into(void* dst, const void* const* srcs, int n, int64_t numel, c10::ScalarType dtype, Reduction op,
                 bool streaming = false);
void reduce_into_reference(void* dst, const void* const* srcs, int n, int64_t numel, c10::ScalarType dtype,
                           Reduction op);

}  // namespace dtensor::detail::shm
