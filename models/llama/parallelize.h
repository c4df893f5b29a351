// Parallelizing the Llama model (torchtitan's models/llama3/infra/parallelize.py): parallelize_llama applies the
// TP plan (torchtitan's apply_tp, or HF transformers' base_model_tp_plan) on the "tp" dim and then DDP or FSDP2
// on the "dp" dim. Kept apart from the model, as torchtitan keeps it.
#pragma once

#include <cstdint>
#include <optional>

#include <string>
#include <vector>

#include "common/parallel_dims.h"
#include "dtensor/dp/fully_shard.h"
#include "dtensor/dp/mixed_precision.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/tp/parallelize.h"
#include "llama/config.h"
#include "llama/model.h"

namespace llama {

struct TPOptions {
  bool sequence_parallel = true;  // false: plain Megatron TP (norms replicated, activations Replicate)
  bool loss_parallel = true;      // lm_head output Shard(-1) for LossParallelGuard; false: Replicate logits
  // torchtitan's enable_async_tensor_parallel (needs sequence_parallel): the SP all-gathers fused with the
  // q/k/v, gate/up and lm_head matmuls, the reduce-scatters with o_proj's and down_proj's
  // (dtensor/tp/enable_async_tp.h).
  bool async_tp = false;
  // torchtitan's enable_float8_tensorwise_tp (the projections converted to float8 tensorwise first): the block's
  // styles become Float8ColwiseParallel / Float8RowwiseParallel / PrepareFloat8ModuleInput
  // (dtensor/tp/float8_styles.h), so that sequence parallel's all-gathers move float8 bytes.
  bool float8 = false;
};

// torchtitan's plan for a TP degree `tp`. Heads are never split: throws dtensor::Error naming the module,
// the sizes and the TP degrees that work when tp does not divide the query heads, or the key/value heads
// either way (see HeadReplicatedColwiseParallel). The vocabulary and the feed-forward size may be uneven
// (DTensor's uneven Shard: embed_tokens, lm_head and loss parallel take any vocabulary at any degree).
// The parts a config chooses get their entries: biases follow their weights (Colwise: Shard(0) with the
// weight; Rowwise: Replicate, added once after the reduction), Qwen3's q/k norms are ReplicateParallel on
// the heads' DTensors, and tied embeddings share one Shard(0) weight (the plan re-ties lm_head to
// embed_tokens' DTensor, so both uses' gradients reach one parameter).
dtensor::ParallelizePlan torchtitan_plan(const LlamaConfig& config, int64_t tp, const TPOptions& options = {});

// HF transformers' base_model_tp_plan for the family, as strings, plus *ForCausalLM's lm_head "colwise_rep";
// Qwen3's q/k norms ("replicated_with_grad_allreduce": on the local heads), and with tied embeddings the
// vocab-parallel embed_tokens. The same losses as torchtitan_plan with sequence_parallel = false. The key/value
// heads must divide by tp (HF's plan does not replicate them).
dtensor::ParallelizePlan hf_plan(const LlamaConfig& config, int64_t tp);

// Plain TP for generation (generate.h): Colwise q/k/v/gate/up, Rowwise o/down with Replicate output
// (2 all-reduces per layer per forward), lm_head Colwise with its output gathered to Replicate; embeddings
// and norms whole. k/v heads may be replicated as in torchtitan_plan; the KV cache follows the k/v shards.
dtensor::ParallelizePlan inference_plan(const LlamaConfig& config, int64_t tp);

// The plan keys of the sparse layers' experts ("model.layers.*.mlp.experts" when every layer is sparse, else one per
// sparse layer): where apply_ep places them, and what a TP plan leaves out under expert parallelism.
std::vector<std::string> expert_plan_keys(const LlamaConfig& config);

// Checks the sizes (the errors above) and applies the plan: nothing moves when a check fails. With
// options.async_tp, then enable_async_tp on the same plan (an error without sequence parallel).
void apply_tp(LlamaForCausalLM& model, const dtensor::DeviceMesh& tp_mesh, const TPOptions& options = {});
void apply_inference_tp(LlamaForCausalLM& model, const dtensor::DeviceMesh& tp_mesh);
void apply_hf_tp(LlamaForCausalLM& model, const dtensor::DeviceMesh& tp_mesh);

// Expert parallelism (dtensor/tp/moe_styles.h, ExpertParallel) on every sparse layer's experts, over the
// ("ep") or ("ep", "tp") mesh: whole experts split over "ep", tokens dispatched to them and combined back by
// all_to_alls (inside each expert, TP over "tp"). replicated_tokens: every ep rank holds the same tokens
// (generation): each computes its experts' share of them, and one all-reduce sums the shares. Throws for a dense model or when the
// experts do not divide over ep.
void apply_ep(LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh, bool replicated_tokens = false);
// Generation under expert parallelism: the dense layers whole on every rank, the experts split over the 1-D
// `ep_mesh` (apply_ep with replicated tokens).
void apply_inference_ep(LlamaForCausalLM& model, const dtensor::DeviceMesh& ep_mesh);

// FSDP2 the torchtitan way (apply_fsdp): fully_shard each decoder layer, then the root (embeddings, final
// norm, lm_head), over the "dp" dim of `mesh` (after apply_tp on mesh["tp"], or on a plain model).
void apply_fsdp(LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh, const dtensor::FullyShardOptions& options = {});
// Mixed precision without FSDP, the same granularity: dtensor::mixed_precision on each decoder layer, then the root
// (embeddings, final norm, lm_head).
void apply_mixed_precision(LlamaForCausalLM& model, const dtensor::MixedPrecisionPolicy& policy);

// Which plan apply_model_parallel applies on the "tp" dim: the one value every entry point chooses (llama/build.h).
enum class TPPlan {
  torchtitan,  // torchtitan_plan: sequence parallel and loss parallel as TPOptions say (training)
  hf,          // hf_plan: no sequence or loss parallel (training, from_pretrained's default)
  inference,   // inference_plan: generation's (llama_generate, serve)
  ep,          // generation of a mixture of experts: no TP; the experts split over the mesh (apply_inference_ep)
};
std::string to_string(TPPlan plan);
TPPlan tp_plan_from_string(const std::string& name);  // "torchtitan", "hf", "inference" or "ep"; else dtensor::Error

// What parallelize_llama does on each dim (torchtitan's job_config.parallelism).
// Activation checkpointing (torchtitan's activation_checkpoint.mode): none; full: every transformer block recomputes
// its forward in backward (dtensor/nn/checkpoint.h); selective: every Nth block (selective_ac_option N: blocks N-1,
// 2N-1, ... counted from 0, as torchtitan's layer SAC).
enum class ACMode { none, full, selective };
std::string to_string(ACMode mode);
ACMode ac_mode_from_string(const std::string& name);  // "none" | "full" | "selective"; else dtensor::Error naming it
struct ActivationCheckpointConfig {
  ACMode mode = ACMode::none;
  int64_t selective_every = 2;  // selective: every Nth block
};
// checkpoint_wrapper on the blocks `config` names; returns how many.
int64_t apply_ac(LlamaForCausalLM& model, const ActivationCheckpointConfig& config);

struct ParallelizeConfig {
  TPPlan plan = TPPlan::torchtitan;
  TPOptions tp = {};                  // the torchtitan plan's options
  bool gradient_sync = true;          // false: Partial gradients reduced by every op that reads them (PyTorch's way)
  dtensor::FullyShardOptions fsdp = {};  // with DataParallel::fsdp (its mp_policy is set from mp_policy below)
  // Mixed precision (torchtitan's mixed_precision_param / _reduce): under FSDP its mp_policy; otherwise
  // dtensor::mixed_precision on each block, then the root. nullopt: compute in the parameters' dtype.
  std::optional<dtensor::MixedPrecisionPolicy> mp_policy;
  // Float8 training (torchtitan's float8 converter): every Linear but lm_head and the MoE routers computes through
  // float8 matmuls (dtensor/float8/float8_linear.h), converted before the TP plan. nullopt: none.
  std::optional<dtensor::Float8LinearConfig> float8;
  ActivationCheckpointConfig ac = {};  // after the TP plan, before data parallel (torchtitan's order)
};

// torchtitan's parallelize_llama: the TP plan on dims.tp_mesh() (nothing at TP 1: the plain model), then, at
// dp > 1, dims.data_parallel over the whole mesh (replicate or apply_fsdp). dims must hold its mesh.
// With dims.ep > 1 (a mixture of experts): the TP plan leaves the experts to apply_ep on dims.expert_mesh(),
// and data parallel is DDP: the dense parameters averaged over all dp ranks, each expert's gradient (already
// summed over the tokens of its ep group) summed over "dp" and divided by dp. FSDP with EP is refused.
void parallelize_llama(LlamaForCausalLM& model, const models::ParallelDims& dims, const ParallelizeConfig& config = {});
// The model for `config` on the meta device: shapes and dtypes, no memory. What llama::build_model (llama/build.h)
// starts from: the plan cuts it, dtensor::nn::to_empty allocates each rank's shards, then they are filled.
LlamaForCausalLM meta_model(const LlamaConfig& config);

// parallelize_llama's two stages. A model built on the meta device takes the first before its parameters exist
// (dtensor::nn::to_empty keeps the TP gradient-sync hooks) and the second after they are filled: DDP's, FSDP's and
// mixed precision's state holds the parameters themselves (llama::build_model).
void apply_model_parallel(LlamaForCausalLM& model, const models::ParallelDims& dims, const ParallelizeConfig& config = {});
void apply_data_parallel(LlamaForCausalLM& model, const models::ParallelDims& dims, const ParallelizeConfig& config = {});
// Whether a step must hold a LossParallelGuard: the logits come Shard(-1) (vocab).
bool loss_parallel_enabled(const models::ParallelDims& dims, const ParallelizeConfig& config);

}  // namespace llama
