#include "dtensor/core/moe_combine.h"

#include <ATen/ATen.h>

namespace dtensor {

at::Tensor sum_expert_shares(const at::Tensor& shares, const at::Tensor& idx, at::ScalarType dtype) {
  const int64_t tokens = shares.size(0), k = shares.size(1), h = shares.size(2);
  const at::Tensor by_expert = at::argsort(idx, /*stable=*/true, -1).unsqueeze(-1).expand({tokens, k, h});
  const at::Tensor ordered = shares.to(dtype).gather(1, by_expert);
  at::Tensor out = ordered.select(1, 0);
  for (int64_t j = 1; j < k; ++j) out = out + ordered.select(1, j);
  return out;
}

}  // namespace dtensor
