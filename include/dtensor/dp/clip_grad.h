// Gradient clipping over a mix of DTensor and plain parameters, with torch::nn::utils::clip_grad_norm_'s
// signature and semantics: the total norm is the norm of all gradients taken as one vector of full (global)
// values, and every gradient is scaled by min(1, max_norm / (total_norm + 1e-6)).
//
//   double total = dtensor::clip_grad_norm_(model->parameters(), /*max_norm=*/1.0);
//
// torch's own clip_grad_norm_ runs too when every gradient is a DTensor (its ops dispatch), but a model
// with some plain parameters (e.g. norm weights left unsharded when sequence parallel is off) mixes plain
// and DTensor arguments in one op. Here each gradient contributes its global norm:
//   - a plain gradient is replicated: its local norm counts once;
//   - a DTensor gradient's local shard counts once per distinct shard: summed over the mesh dims on which
//     it is Shard, once over the dims on which it is Replicate; a Partial gradient is reduced first
//     (Partial -> Replicate = all-reduce), as its local values are not its value.
// One all-reduce per mesh carries the contributions of all DTensor gradients on it; the scaling is local.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace dtensor {

// norm_type: any p (2, 1, inf, -inf, 0, ...). Returns the total norm. Parameters without a gradient are
// skipped. error_if_nonfinite: throw dtensor::Error when the total norm is nan or inf (gradients untouched).
// Collective: every rank of every mesh the DTensor gradients live on must call it, with its parameters in
// the same order.
double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
double clip_grad_norm_(const at::Tensor& parameter, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// The total norm alone (no scaling): the first half of clip_grad_norm_ (torch's get_total_norm).
double get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

}  // namespace dtensor
