// One block of ring attention (context_parallel.h): the queries of global chunk i against the keys of global chunk j,
// each chunk m tokens long. Its visibility, its mask and its kernels (forward and backward).
//
// Placement of a block, with distance = query position - key position (in [(i - j) m - (m - 1), (i - j) m + m - 1]):
//   full attention: whole;
//   causal: j > i hidden, j == i causal (the diagonal), j < i whole;
//   a sliding window W (causal): hidden when every distance >= W; else, when some distance is >= W (or the diagonal
//   with m > W), an additive mask of 0 <= distance < W, whose rows that see nothing are `dead` (their lse is -inf,
//   so the merge gives them no weight).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>
#include <utility>

namespace dtensor::cp::internal {

struct BlockMask {
  bool causal = false;  // the diagonal: the kernel's own causal mask
  at::Tensor additive;  // [m, m] (0 or -inf) in the queries' dtype; undefined: none
  at::Tensor dead;      // [m] bool: rows the additive mask hides whole; undefined: none
};

struct BlockSpec {
  bool causal = true;
  int64_t sliding_window = 0;  // 0: none
  double softcap = 0.0;        // 0: none
  double scale = 1.0;
};

// nullopt: the block is hidden whole. `like` gives the mask's dtype and device.
std::optional<BlockMask> block_mask(int64_t i, int64_t j, int64_t m, const BlockSpec& spec, const at::Tensor& like);

// (out [b, h, m, d] in q's dtype, lse [b, h, m] fp32, -inf on dead rows). The CPU's flash kernel, else (another
// device, soft-capping) the math written out in fp32.
std::pair<at::Tensor, at::Tensor> block_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const BlockMask& mask, const BlockSpec& spec);

// The block's (dq, dk, dv) given the merged output and log-sum-exp of its queries (flash attention's backward).
std::tuple<at::Tensor, at::Tensor, at::Tensor> block_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                                              const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                                              const BlockMask& mask, const BlockSpec& spec);

}  // namespace dtensor::cp::internal
