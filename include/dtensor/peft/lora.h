// LoRA (PEFT's LoraConfig / LoraModel, Hu et al. 2021) on a model plain or already parallelized: each targeted Linear
// y = x W^T + b becomes
//
//   y = x W^T + b + scaling * (dropout(x) A^T) B^T,   A [r, in], B [out, r], scaling = alpha / r (rsLoRA: alpha / sqrt(r))
//
// with W and b frozen, A and B the only trainable parameters, registered as PEFT names them: `<module>.lora_A.weight`,
// `<module>.lora_B.weight` (PEFT saves them as `base_model.model.<module>.lora_A.weight`: dtensor/peft/adapter.h).
// As PEFT: the branch computes in the adapters' dtype (x is cast to A's), and the sum is cast back to the base output's.
//
// Under TP each adapter is sharded to match its base layer's style, read off the base weight's placement, so that the
// branch needs no communication of its own (b, s: batch, sequence; the base's output layout is the branch's):
//   Colwise base   W Shard(0)   A Replicate, B Shard(0):  x Replicate . A^T -> Replicate [b, s, r]; . B^T -> Shard(-1),
//                               the base's own output layout, added locally
//   Rowwise base   W Shard(1)   A Shard(1), B Replicate:  x Shard(-1) . A^T (Shard(0)) -> Partial [b, s, r]; . B^T ->
//                               Partial, added to the base's Partial output: the style's one reduction sums both
//   Replicate base W Replicate  A, B Replicate
// Backward is the conjugate: A's gradient under a Colwise base is Partial (each rank's output rows), reduced to
// Replicate by gradient sync (dtensor/dp/gradient_sync.h) once per backward; B's is local. Under a Rowwise base A's is
// local and B's Partial -> Replicate. Merging (merge_adapter) is local on every rank: W's local shard += scaling *
// local(B) @ local(A), since (Shard(0) rows of B) @ A are W's Shard(0) rows and B @ (Shard(1) columns of A) W's Shard(1)
// columns.
//
//   auto targets = dtensor::peft::inject_adapter(*model, {.r = 8, .lora_alpha = 16, .target_modules = {"q_proj", "v_proj"}});
//   dtensor::peft::mark_only_lora_as_trainable(*model);   // before data parallel: DDP buckets the adapters only
//
// Refused by name: a target that matches no module (PEFT's "Target modules ... not found"), one that is no Linear
// (dtensor::nn::Linear), one whose forward another pass replaced (async TP's fused matmuls, float8), a base weight laid
// out otherwise than above (a 2-D mesh, HeadReplicatedColwiseParallel's replicated heads), dropout under TP.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dtensor::peft {

// PEFT's LoraConfig, the fields this implements.
struct LoraConfig {
  int64_t r = 8;
  double lora_alpha = 8;
  // PEFT's list semantics: a module is a target when its name equals an entry or ends with "." + entry. The one string
  // "all-linear" (PEFT's) targets every Linear but the output layer (lm_head).
  std::vector<std::string> target_modules;
  double lora_dropout = 0.0;
  bool use_rslora = false;
  double scaling() const;
};

// Throws dtensor::Error naming the field: r < 1, alpha <= 0, dropout outside [0, 1), no targets.
void validate(const LoraConfig& config);

// The names of the modules of `model` that config's targets select, in module order; throws dtensor::Error as
// inject_adapter does for a target that matches nothing or a module that cannot carry an adapter (run it on a meta
// model to check a config before anything is built).
std::vector<std::string> find_targets(torch::nn::Module& model, const LoraConfig& config);

// Adds A and B (in fp32, or `dtype`) to every target of `model` and returns the targets' names in module order.
// Initialization is PEFT's (init_lora_weights=True): A kaiming-uniform (bound 1 / sqrt(in)), B zeros, A drawn from
// `seed` and the module's name alone, so every rank holds its part of the same values at every TP degree.
std::vector<std::string> inject_adapter(torch::nn::Module& model, const LoraConfig& config, uint64_t seed = 0,
                                        at::ScalarType dtype = at::kFloat);

// PEFT's mark_only_lora_as_trainable (bias="none"): every parameter but the adapters' stops requiring grad.
// Returns the trainable parameters' element count (global, not per rank).
int64_t mark_only_lora_as_trainable(torch::nn::Module& model);

// Whether a parameter's name (a state dict key) is an adapter's.
bool is_lora_parameter(const std::string& name);
// Whether `module` carries an adapter (inject_adapter).
bool has_adapter(const torch::nn::Module& module);
// The config an injected model's adapters were made with (the first adapter's); throws when there is none.
LoraConfig adapter_config(torch::nn::Module& model);

// PEFT's merge_adapter: every base weight += scaling * B @ A, computed in fp32 and added in the weight's dtype
// (PEFT's order on CPU); from then on the adapters are skipped in forward. Local on every rank (see above).
void merge_adapter(torch::nn::Module& model);
// PEFT's disable_adapter / enable: the branch skipped or not (the base model's outputs while disabled).
void set_adapter_enabled(torch::nn::Module& model, bool enabled);

}  // namespace dtensor::peft
