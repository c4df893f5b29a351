// Applying the plans (parallelize_plans.cpp) and data parallelism to the model: parallelize_llama, as torchtitan's
// models/llama3/infra/parallelize.py (apply_tp, apply_fsdp, ...).
#include "llama/parallelize.h"

#include <set>

#include "dtensor/core/error.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/dp/replicate.h"
#include "dtensor/tp/enable_async_tp.h"
#include "dtensor/tp/moe_styles.h"
#include "dtensor/tp/style.h"
#include "dtensor/nn/checkpoint.h"
#include "dtensor/nn/default_device.h"
#include "dtensor/nn/parameter_replacement.h"

namespace llama {
namespace {

using namespace dtensor;

// A tied lm_head.weight is embed_tokens.weight: the plans shard both Shard(0) (vocab), and after the plan
// lm_head takes embed_tokens' DTensor again, so there is one parameter and both uses' gradients reach it.
void tie_embeddings(LlamaForCausalLM& model) {
  if (!model->config.tie_word_embeddings || !model->lm_head || !model->model->embed_tokens) return;
  nn::replace_parameter(*model->lm_head, "weight", model->model->embed_tokens->weight);
}

// The plan without its experts' entries: under expert parallelism apply_ep places them.
ParallelizePlan without_experts(ParallelizePlan plan) {
  std::erase_if(plan, [](const auto& entry) { return entry.first.ends_with(".mlp.experts"); });
  return plan;
}

void require_experts(const LlamaConfig& c) {
  DTENSOR_CHECK(c.moe.num_experts > 0, "dtensor: expert parallelism needs a mixture of experts; this '",
                c.model_type, "' model is dense");
}

// Data parallel beside expert parallelism (see parallelize.h): two sets of DDP buckets.
void replicate_with_experts(LlamaForCausalLM& model, const models::ParallelDims& dims) {
  std::vector<at::Tensor> dense, experts;
  for (const auto& item : model->named_parameters(/*recurse=*/true)) {
    (item.key().find(".mlp.experts.") != std::string::npos ? experts : dense).push_back(item.value());
  }
  disable_gradient_sync(*model);
  enable_gradient_sync(dense, {.data_parallel_mesh = dims.data_mesh()});
  enable_gradient_sync(experts, {.data_parallel_mesh = dims.world_mesh()["dp"],
                                 .gradient_divide_factor = static_cast<double>(dims.dp)});
}

// A pipeline stage (parallelize_pipeline.h) holds some of the modules the plan names: the plan's entries for the
// others (embed_tokens before the first stage's, norm and lm_head after the last's) are left out. Patterns (layers.*)
// match the layers the stage holds.
ParallelizePlan present_only(ParallelizePlan plan, LlamaForCausalLM& model) {
  std::set<std::string> names;
  for (const auto& item : model->named_modules()) names.insert(item.key());
  std::erase_if(plan, [&](const auto& entry) {
    return entry.first.find('*') == std::string::npos && !names.contains(entry.first);
  });
  return plan;
}

void apply_plan(LlamaForCausalLM& model, const DeviceMesh& tp_mesh, const ParallelizePlan& plan) {
  parallelize_module(*model, tp_mesh, present_only(plan, model));
  tie_embeddings(model);
}

}  // namespace

void apply_tp(LlamaForCausalLM& model, const DeviceMesh& tp_mesh, const TPOptions& options) {
  DTENSOR_CHECK(!options.async_tp || options.sequence_parallel,
                "dtensor: llama TP plan: async TP fuses sequence parallel's all-gathers and reduce-scatters "
                "with their matmuls; it needs sequence_parallel");
  const ParallelizePlan plan = torchtitan_plan(model->config, tp_mesh.size(), options);
  apply_plan(model, tp_mesh, plan);
  if (options.async_tp) enable_async_tp(*model, tp_mesh, plan);
}

void apply_inference_tp(LlamaForCausalLM& model, const DeviceMesh& tp_mesh) {
  apply_plan(model, tp_mesh, inference_plan(model->config, tp_mesh.size()));
}

void apply_hf_tp(LlamaForCausalLM& model, const DeviceMesh& tp_mesh) {
  apply_plan(model, tp_mesh, hf_plan(model->config, tp_mesh.size()));
}

void apply_ep(LlamaForCausalLM& model, const DeviceMesh& mesh, bool replicated_tokens) {
  require_experts(model->config);
  parallelize_experts(*model, mesh, expert_plan_keys(model->config), {.replicated_tokens = replicated_tokens});
}

void apply_inference_ep(LlamaForCausalLM& model, const DeviceMesh& ep_mesh) {
  DTENSOR_CHECK(ep_mesh.ndim() == 1, "dtensor: apply_inference_ep takes a 1-D (\"ep\") mesh, got ", ep_mesh.to_string());
  apply_ep(model, ep_mesh, /*replicated_tokens=*/true);
}

void apply_fsdp(LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh, const dtensor::FullyShardOptions& options) {
  for (const auto& layer : model->model->layers->values()) dtensor::fully_shard(*layer, mesh, options);
  dtensor::fully_shard(*model, mesh, options);
}

void apply_mixed_precision(LlamaForCausalLM& model, const dtensor::MixedPrecisionPolicy& policy) {
  for (const auto& layer : model->model->layers->values()) dtensor::mixed_precision(*layer, policy);
  dtensor::mixed_precision(*model, policy);
}

std::string to_string(ACMode mode) {
  switch (mode) {
    case ACMode::none: return "none";
    case ACMode::full: return "full";
    case ACMode::selective: return "selective";
  }
  return "none";
}

ACMode ac_mode_from_string(const std::string& name) {
  if (name == "none") return ACMode::none;
  if (name == "full") return ACMode::full;
  if (name == "selective") return ACMode::selective;
  DTENSOR_CHECK(false, "dtensor: activation checkpointing mode '", name, "': expected none, full or selective");
  return ACMode::none;
}

int64_t apply_ac(LlamaForCausalLM& model, const ActivationCheckpointConfig& config) {
  DTENSOR_CHECK(config.mode != ACMode::selective || config.selective_every >= 1,
                "dtensor: selective activation checkpointing every ", config.selective_every, " blocks: must be >= 1");
  int64_t wrapped = 0, index = 0;
  for (const auto& layer : model->model->layers->values()) {
    const bool take = config.mode == ACMode::full ||
                      (config.mode == ACMode::selective && (index + 1) % config.selective_every == 0);
    if (take) dtensor::nn::checkpoint_wrapper(*layer), ++wrapped;
    ++index;
  }
  return wrapped;
}

bool loss_parallel_enabled(const models::ParallelDims& dims, const ParallelizeConfig& config) {
  return dims.tp_enabled() && config.plan == TPPlan::torchtitan && config.tp.loss_parallel;
}

void apply_model_parallel(LlamaForCausalLM& model, const models::ParallelDims& dims, const ParallelizeConfig& config) {
  // Float8 first, as torchtitan's model converters run before parallelize: the converted layers keep their
  // parameters, so the plan shards them as any Linear's, and each computes on its shards (float8_linear.h).
  if (config.float8) dtensor::convert_to_float8_training(*model, *config.float8, dtensor::default_float8_filter);
  const bool ep = dims.ep_enabled();
  if (ep) {
    require_experts(model->config);  // before any plan moves a parameter
    DTENSOR_CHECK(dims.data_parallel == models::DataParallel::ddp,
                  "dtensor: FSDP beside expert parallelism is not supported; use DDP (--ddp) with --ep");
  }
  if (dims.tp_enabled()) {
    const DeviceMesh tp_mesh = dims.tp_mesh();
    ParallelizePlan plan;
    TPOptions tp = config.tp;
    // torchtitan's enable_float8_tensorwise_tp: the float8 styles where the layers are float8 tensorwise (the
    // rowwise recipe keeps the plain styles: high-precision collectives).
    tp.float8 = config.float8 && config.float8->recipe == dtensor::Float8Recipe::tensorwise;
    switch (config.plan) {
      case TPPlan::torchtitan: plan = torchtitan_plan(model->config, tp_mesh.size(), tp); break;
      case TPPlan::hf: plan = hf_plan(model->config, tp_mesh.size()); break;
      case TPPlan::inference: plan = inference_plan(model->config, tp_mesh.size()); break;
      case TPPlan::ep:
        DTENSOR_CHECK(!ep, "dtensor: llama plan 'ep' (generation's expert parallelism over the whole mesh) does not "
                           "compose with an ep dim");
        return apply_inference_ep(model, tp_mesh);
    }
    const bool async_tp = config.plan == TPPlan::torchtitan && config.tp.async_tp;
    DTENSOR_CHECK(!async_tp || config.tp.sequence_parallel,
                  "dtensor: llama TP plan: async TP fuses sequence parallel's all-gathers and reduce-scatters "
                  "with their matmuls; it needs sequence_parallel");
    if (ep) plan = without_experts(std::move(plan));
    apply_plan(model, tp_mesh, plan);
    if (async_tp) enable_async_tp(*model, tp_mesh, plan);
    if (!config.gradient_sync) disable_gradient_sync(*model);
  }
  if (ep) apply_ep(model, dims.expert_mesh());
  apply_ac(model, config.ac);
}

void apply_data_parallel(LlamaForCausalLM& model, const models::ParallelDims& dims, const ParallelizeConfig& config) {
  const bool fsdp = dims.dp_enabled() && !dims.ep_enabled() && dims.data_parallel == models::DataParallel::fsdp;
  // Without FSDP the masters' gradients are reduced where they accumulate, in fp32 (TP's gradient sync, DDP's
  // buckets); FSDP gathers in param_dtype and reduce-scatters in reduce_dtype itself.
  if (config.mp_policy && !fsdp) apply_mixed_precision(model, *config.mp_policy);
  if (!dims.dp_enabled()) return;
  if (dims.ep_enabled()) return replicate_with_experts(model, dims);
  if (fsdp) {
    dtensor::FullyShardOptions options = config.fsdp;
    if (config.mp_policy) options.mp_policy = *config.mp_policy;
    return apply_fsdp(model, dims.world_mesh(), options);
  }
  replicate(*model, dims.world_mesh());
}

LlamaForCausalLM meta_model(const LlamaConfig& config) {
  dtensor::nn::DefaultDeviceGuard meta(at::kMeta);
  return LlamaForCausalLM(config);
}

void parallelize_llama(LlamaForCausalLM& model, const models::ParallelDims& dims, const ParallelizeConfig& config) {
  apply_model_parallel(model, dims, config);
  apply_data_parallel(model, dims, config);
}

std::string to_string(TPPlan plan) {
  switch (plan) {
    case TPPlan::torchtitan: return "torchtitan";
    case TPPlan::hf: return "hf";
    case TPPlan::inference: return "inference";
    case TPPlan::ep: return "ep";
  }
  return "?";
}

TPPlan tp_plan_from_string(const std::string& name) {
  for (TPPlan plan : {TPPlan::torchtitan, TPPlan::hf, TPPlan::inference, TPPlan::ep}) {
    if (name == to_string(plan)) return plan;
  }
  throw DTENSOR_ERROR("dtensor: unknown llama plan '", name, "' (torchtitan, hf, inference or ep)");
}

}  // namespace llama
