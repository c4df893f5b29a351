// The plans. Placement algebra along one layer under torchtitan's plan with sequence parallel (b, s, h:
// batch, sequence, hidden; activations between blocks are this rank's local Shard(1) part [b, s/tp, h]):
//   embed_tokens   Rowwise: weight Shard(0) (vocab); masked lookup is Partial -> Shard(1): reduce-scatter
//   *_layernorm    SequenceParallel: weight Replicate, runs on Shard(1) as it is
//   self_attn/mlp  PrepareModuleInput: x Shard(1) -> Replicate: all-gather (b·s·h); cos/sin Replicate
//   q/k/v, gate/up Colwise: weight Shard(0), output Shard(-1) (heads / ffn columns), no comm
//   o/down_proj    Rowwise: weight Shard(1), output Partial -> Shard(1): reduce-scatter (b·s·h)
//   norm, lm_head  Colwise(input Shard(1) -> Replicate: all-gather), output Shard(-1) for loss parallel
// Backward runs the conjugates: each all-gather's gradient is a reduce-scatter and vice versa.
// Without sequence parallel the Shard(1)s become Replicate: the two all-gathers vanish and the two
// reduce-scatters become all-reduces.
//
// The inference plan (decoding, one token per step: no sequence to shard) is plain Megatron TP:
//   embed_tokens, norms  not in the plan: weights whole on every rank, activations replicated plain tensors
//   self_attn            PrepareModuleInput: x, cos, sin, mask Replicate (no comm)
//   q/k/v, gate/up       Colwise: output Shard(-1); k/v's heads are the KV cache's Shard(1), no comm
//   o/down_proj          Rowwise: output Partial -> Replicate: all-reduce (b·s·h), two per layer
//   lm_head              Colwise, output Shard(-1) -> Replicate: all-gather of the logits (b·1·vocab when
//                        the caller feeds it the last position only, as generate does)
#include "llama/parallelize.h"

#include "dtensor/core/error.h"
#include "dtensor/dp/gradient_sync.h"
#include "dtensor/dp/replicate.h"
#include "dtensor/tp/enable_async_tp.h"
#include "dtensor/tp/head_replicated_colwise.h"
#include "dtensor/tp/style.h"

namespace llama {
namespace {

using namespace dtensor;

void require_divisible(const std::string& module, const std::string& what, int64_t size, int64_t tp) {
  DTENSOR_CHECK(size % tp == 0, "dtensor: llama TP plan: '", module, "' has ", size, " ", what,
                ", not divisible by the TP degree ", tp);
}

void check_sizes(const LlamaConfig& c, int64_t tp, bool allow_replicated_kv) {
  require_divisible("model.layers.*.self_attn.q_proj", "query heads", c.num_attention_heads, tp);
  const int64_t kv = c.num_key_value_heads;
  DTENSOR_CHECK(!allow_replicated_kv || kv % tp == 0 || tp % kv == 0,
                "dtensor: llama TP plan: 'model.layers.*.self_attn.k_proj' has ", kv,
                " key/value heads and the TP degree is ", tp,
                ": they divide neither way (kv heads % tp == 0, or tp % kv heads == 0 to replicate heads)");
  if (!allow_replicated_kv) require_divisible("model.layers.*.self_attn.k_proj", "key/value heads", kv, tp);
  require_divisible("model.layers.*.mlp.gate_proj", "intermediate features", c.intermediate_size, tp);
  require_divisible("lm_head", "vocabulary entries", c.vocab_size, tp);
  DTENSOR_CHECK(!c.tie_word_embeddings || tp <= 1,
                "dtensor: llama TP plan: tied embeddings (lm_head.weight is model.embed_tokens.weight) "
                "are not supported at TP degree ", tp);
}

}  // namespace

ParallelizePlan torchtitan_plan(const LlamaConfig& c, int64_t tp, const TPOptions& o) {
  check_sizes(c, tp, /*allow_replicated_kv=*/true);
  const Placement act = o.sequence_parallel ? Placement(Shard(1)) : Placement(Replicate());  // between blocks
  const Placement logits = o.loss_parallel ? Placement(Shard(-1)) : Placement(Replicate());
  // k, v: GQA heads replicated on the ranks that share them when the TP degree exceeds the kv heads.
  const HeadReplicatedColwiseParallel kv({.num_heads = c.num_key_value_heads, .head_dim = c.head_dim()});
  const RowwiseParallel rowwise_out({.output_layouts = act});

  ParallelizePlan plan = {
      {"model.embed_tokens", RowwiseParallel({.input_layouts = Replicate(), .output_layouts = act})},
      {"lm_head", ColwiseParallel({.input_layouts = act, .output_layouts = logits, .use_local_output = !o.loss_parallel})},
      // (x, cos, sin, mask)
      {"model.layers.*.self_attn", PrepareModuleInput({.input_layouts = {act, Replicate(), Replicate(), Replicate()},
                                                       .desired_input_layouts = {Replicate(), Replicate(), Replicate(),
                                                                                 Replicate()}})},
      {"model.layers.*.self_attn.q_proj", ColwiseParallel({.use_local_output = false})},  // views see global shapes
      {"model.layers.*.self_attn.k_proj", kv},
      {"model.layers.*.self_attn.v_proj", kv},
      {"model.layers.*.self_attn.o_proj", rowwise_out},
      {"model.layers.*.mlp", PrepareModuleInput({.input_layouts = {act}, .desired_input_layouts = {Replicate()}})},
      {"model.layers.*.mlp.gate_proj", ColwiseParallel()},
      {"model.layers.*.mlp.up_proj", ColwiseParallel()},
      {"model.layers.*.mlp.down_proj", rowwise_out},
  };
  if (o.sequence_parallel) {
    for (const char* norm : {"model.norm", "model.layers.*.input_layernorm", "model.layers.*.post_attention_layernorm"}) {
      plan.emplace_back(norm, SequenceParallel());
    }
  }
  return plan;
}

ParallelizePlan inference_plan(const LlamaConfig& c, int64_t tp) {
  check_sizes(c, tp, /*allow_replicated_kv=*/true);
  // k, v: their output, and so the KV cache, is Shard(1) by heads.
  const HeadReplicatedColwiseParallel kv({.num_heads = c.num_key_value_heads, .head_dim = c.head_dim()});
  // model.embed_tokens and the norms are not in the plan: their weights stay whole on every rank.
  return {
      // (x, cos, sin, mask): replicated plain tensors become Replicate DTensors
      {"model.layers.*.self_attn", PrepareModuleInput({.input_layouts = {Replicate(), Replicate(), Replicate(), Replicate()},
                                                       .desired_input_layouts = {Replicate(), Replicate(), Replicate(),
                                                                                 Replicate()}})},
      {"model.layers.*.self_attn.q_proj", ColwiseParallel({.use_local_output = false})},  // views into heads
      {"model.layers.*.self_attn.k_proj", kv},
      {"model.layers.*.self_attn.v_proj", kv},
      {"model.layers.*.self_attn.o_proj", RowwiseParallel()},  // Partial -> Replicate: all-reduce
      {"model.layers.*.mlp.gate_proj", ColwiseParallel()},
      {"model.layers.*.mlp.up_proj", ColwiseParallel()},
      {"model.layers.*.mlp.down_proj", RowwiseParallel()},  // Partial -> Replicate: all-reduce
      // Shard(-1) -> Replicate: one all-gather of [b, 1, vocab] per step
      {"lm_head", ColwiseParallel({.output_layouts = Replicate()})},
  };
}

ParallelizePlan hf_plan(const LlamaConfig& c, int64_t tp) {
  check_sizes(c, tp, /*allow_replicated_kv=*/false);
  return plan_from_strings({
      {"model.layers.*.self_attn.q_proj", "colwise"},
      {"model.layers.*.self_attn.k_proj", "colwise"},
      {"model.layers.*.self_attn.v_proj", "colwise"},
      {"model.layers.*.self_attn.o_proj", "rowwise"},
      {"model.layers.*.mlp.gate_proj", "colwise"},
      {"model.layers.*.mlp.up_proj", "colwise"},
      {"model.layers.*.mlp.down_proj", "rowwise"},
      {"lm_head", "colwise_rep"},
  });
}

void apply_tp(LlamaForCausalLM& model, const DeviceMesh& tp_mesh, const TPOptions& options) {
  DTENSOR_CHECK(!options.async_tp || options.sequence_parallel,
                "dtensor: llama TP plan: async TP fuses sequence parallel's all-gathers and reduce-scatters "
                "with their matmuls; it needs sequence_parallel");
  const ParallelizePlan plan = torchtitan_plan(model->config, tp_mesh.size(), options);
  parallelize_module(*model, tp_mesh, plan);
  if (options.async_tp) enable_async_tp(*model, tp_mesh, plan);
}

void apply_inference_tp(LlamaForCausalLM& model, const DeviceMesh& tp_mesh) {
  parallelize_module(*model, tp_mesh, inference_plan(model->config, tp_mesh.size()));
}

void apply_hf_tp(LlamaForCausalLM& model, const DeviceMesh& tp_mesh) {
  parallelize_module(*model, tp_mesh, hf_plan(model->config, tp_mesh.size()));
}

void apply_fsdp(LlamaForCausalLM& model, const dtensor::DeviceMesh& mesh, const dtensor::FullyShardOptions& options) {
  for (const auto& layer : *model->model->layers) dtensor::fully_shard(*layer, mesh, options);
  dtensor::fully_shard(*model, mesh, options);
}

bool loss_parallel_enabled(const models::ParallelDims& dims, const ParallelizeConfig& config) {
  return dims.tp_enabled() && config.plan == TPPlan::torchtitan && config.tp.loss_parallel;
}

void parallelize_llama(LlamaForCausalLM& model, const models::ParallelDims& dims, const ParallelizeConfig& config) {
  const DeviceMesh& mesh = dims.world_mesh();
  if (dims.tp_enabled()) {
    const DeviceMesh tp_mesh = dims.tp_mesh();
    switch (config.plan) {
      case TPPlan::torchtitan: apply_tp(model, tp_mesh, config.tp); break;
      case TPPlan::hf: apply_hf_tp(model, tp_mesh); break;
    }
    if (!config.gradient_sync) disable_gradient_sync(*model);
  }
  if (!dims.dp_enabled()) return;
  switch (dims.data_parallel) {
    case models::DataParallel::ddp: replicate(*model, mesh); break;
    case models::DataParallel::fsdp: apply_fsdp(model, mesh, config.fsdp); break;
  }
}

std::string to_string(TPPlan plan) { return plan == TPPlan::hf ? "hf" : "torchtitan"; }

TPPlan tp_plan_from_string(const std::string& name) {
  if (name == "torchtitan") return TPPlan::torchtitan;
  if (name == "hf") return TPPlan::hf;
  throw DTENSOR_ERROR("dtensor: llama TP plan '", name, "' is not torchtitan or hf");
}

}  // namespace llama
