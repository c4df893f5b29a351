// The combine step every mixture-of-experts path shares (the plain experts of model code and ExpertParallel's
// combines in dtensor/tp/moe_styles.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace dtensor {

// The k weighted expert outputs of each token, shares [T, k, H], summed into [T, H] in `dtype`: each share rounded to
// `dtype`, then added in the order of the tokens' expert ids idx [T, k], each sum rounded (transformers' per-expert
// index_add_ loop; bit-equal to it in bf16 for any k).
at::Tensor sum_expert_shares(const at::Tensor& shares, const at::Tensor& idx, at::ScalarType dtype);

}  // namespace dtensor
