// Mixed precision for training (PyTorch's FSDP2 MixedPrecisionPolicy, torchtitan's mixed_precision_param /
// mixed_precision_reduce): parameters stay fp32 (the optimizer's masters, what checkpoints keep), forward and backward
// compute in param_dtype, gradients reach the masters in fp32.
//
//   for (auto& layer : *model->layers) dtensor::mixed_precision(*layer, {.param_dtype = at::kBFloat16});
//   dtensor::mixed_precision(*model, {.param_dtype = at::kBFloat16});
//
// Without FSDP (TP alone, DDP x TP) each forward of a module reads param_dtype copies of its masters made by one
// differentiable cast per parameter (autocast's weight casts, once per forward): the activations, and so TP's
// collectives, are in param_dtype; a copy's gradient is cast back by the cast's backward and accumulated into the
// master's .grad in fp32, where the TP plan's gradient sync and DDP reduce it (reduce_dtype fp32). With FSDP,
// FullyShardOptions::mp_policy gathers the shards in param_dtype and reduce-scatters the gradients in reduce_dtype.
#pragma once

#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <optional>

namespace dtensor {

struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;   // the compute dtype (nullopt: the parameters' own)
  std::optional<at::ScalarType> reduce_dtype;  // gradient reductions (nullopt: param_dtype, as FSDP2)
  std::optional<at::ScalarType> output_dtype;  // the module's floating outputs are cast to it (nullopt: as computed)
  bool cast_forward_inputs = true;             // the module's floating inputs are cast to param_dtype
};

// The TP / DDP form: `module`'s parameters that no earlier mixed_precision call took are computed in
// policy.param_dtype. Apply to each block, then the root (the root takes the rest: embeddings, final norm, head).
// Parameters must be floating; reduce_dtype must be the parameters' dtype or unset (their gradients are reduced
// where they accumulate, in the masters' dtype); otherwise dtensor::Error naming the field. Composes with the TP plan
// and replicate() (in either order); with fully_shard use FullyShardOptions::mp_policy instead.
void mixed_precision(torch::nn::Module& module, const MixedPrecisionPolicy& policy);

// Whether `parameter` was taken by some mixed_precision call.
bool has_mixed_precision(const at::Tensor& parameter);

namespace detail {
// `v` cast to `dtype` when it is a floating tensor of another dtype (cast_forward_inputs, output_dtype); else `v`.
c10::IValue cast_floating(const c10::IValue& v, at::ScalarType dtype);
}  // namespace detail

}  // namespace dtensor
