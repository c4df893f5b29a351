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
#include "dtensor/tp/float8_styles.h"
#include "dtensor/tp/head_replicated_colwise.h"
#include "dtensor/tp/moe_styles.h"
#include "dtensor/tp/style.h"

namespace llama {
namespace {

using namespace dtensor;

// The TP degrees (up to the query heads) at which `fits` holds, for the errors: "works at TP 1, 2, 4".
std::string degrees_that_work(const LlamaConfig& c, bool (*fits)(const LlamaConfig&, int64_t)) {
  std::string out;
  for (int64_t d = 1; d <= c.num_attention_heads; ++d) {
    if (fits(c, d)) out += (out.empty() ? "" : ", ") + std::to_string(d);
  }
  return out;
}

// Heads are never split: the query heads divide evenly; the key/value heads too, or (when replication is
// allowed) each is replicated on tp / kv_heads ranks. Everything else may be uneven (a Shard of any size:
// the vocabulary of embed_tokens / lm_head / loss parallel, the feed-forward columns).
bool heads_fit(const LlamaConfig& c, int64_t tp) {
  const int64_t kv = c.num_key_value_heads;
  return c.num_attention_heads % tp == 0 && (kv % tp == 0 || tp % kv == 0);
}
bool heads_fit_unreplicated(const LlamaConfig& c, int64_t tp) {
  return c.num_attention_heads % tp == 0 && c.num_key_value_heads % tp == 0;
}

void check_sizes(const LlamaConfig& c, int64_t tp, bool allow_replicated_kv) {
  // OLMo2's k_norm spans all key/value heads: a rank holding a replicated head would see a part of them
  // that is no shard of the whole.
  DTENSOR_CHECK(!c.attention.qk_norm_full_width || c.num_key_value_heads % tp == 0, "dtensor: llama TP plan: ",
                "'model.layers.*.self_attn.k_norm' normalizes over all ", c.num_key_value_heads,
                " key/value heads, which the TP degree ", tp, " does not divide (they cannot be replicated under "
                "it); TP degrees that work: ", degrees_that_work(c, heads_fit_unreplicated));
  DTENSOR_CHECK(c.num_attention_heads % tp == 0, "dtensor: llama TP plan: 'model.layers.*.self_attn.q_proj' has ",
                c.num_attention_heads, " query heads, not divisible by the TP degree ", tp,
                " (heads are not split); TP degrees that work: ",
                degrees_that_work(c, allow_replicated_kv ? heads_fit : heads_fit_unreplicated));
  const int64_t kv = c.num_key_value_heads;
  if (allow_replicated_kv) {
    DTENSOR_CHECK(kv % tp == 0 || tp % kv == 0, "dtensor: llama TP plan: 'model.layers.*.self_attn.k_proj' has ", kv,
                  " key/value heads and the TP degree is ", tp,
                  ": they divide neither way (kv heads % tp == 0, or tp % kv heads == 0 to replicate heads); "
                  "TP degrees that work: ", degrees_that_work(c, heads_fit));
  } else {
    DTENSOR_CHECK(kv % tp == 0, "dtensor: llama TP plan: 'model.layers.*.self_attn.k_proj' has ", kv,
                  " key/value heads, not divisible by the TP degree ", tp,
                  " (HF's plan does not replicate heads; the torchtitan and inference plans do); TP degrees that work: ",
                  degrees_that_work(c, heads_fit_unreplicated));
  }
}

// q/k norms on DTensor heads, weight Replicate. Per head (Qwen3, Gemma 3: over head_dim) the heads'
// Shard(2) is kept. Over all heads (OLMo2: over heads * head_dim, which is Shard(-1)) mean(x^2) over the
// sharded dim is Partial, made Replicate by one all-reduce of [b, s, 1]; the weight meets its Shard(-1)
// slice locally. Either way the weight gradient is a sum over the ranks' heads, Partial -> Replicate: one
// all-reduce (HF's "replicated_with_grad_allreduce").
void add_qk_norms(const LlamaConfig& c, ParallelizePlan& plan) {
  if (!c.attention.qk_norm && !c.attention.qk_norm_full_width) return;
  for (const char* norm : {"model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"}) plan.emplace_back(norm, ReplicateParallel());
}

// The layers (as a plan key's atom) whose MLP is dense, and those whose MLP is a SparseMoeBlock: "*" when all
// are.
std::vector<std::string> layers_where(const LlamaConfig& c, bool sparse) {
  if (c.moe.num_experts == 0) return sparse ? std::vector<std::string>{} : std::vector<std::string>{"*"};
  std::vector<std::string> out;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.layer_is_moe(i) == sparse) out.push_back(std::to_string(i));
  }
  return out;
}

// The dense MLPs' projections: into the hidden size (Colwise) and back (Rowwise).
std::vector<std::string> mlp_in(const LlamaConfig& c) {
  std::vector<std::string> out;
  for (const auto& l : layers_where(c, false)) {
    const std::string mlp = "model.layers." + l + ".mlp.";
    if (c.mlp.kind == MlpKind::plain) {
      out.push_back(mlp + "c_fc");
    } else {
      out.push_back(mlp + "gate_proj");
      out.push_back(mlp + "up_proj");
    }
  }
  return out;
}
std::vector<std::string> mlp_out(const LlamaConfig& c) {
  std::vector<std::string> out;
  for (const auto& l : layers_where(c, false)) out.push_back("model.layers." + l + (c.mlp.kind == MlpKind::plain ? ".mlp.c_proj" : ".mlp.down_proj"));
  return out;
}

// A sparse MLP (llama/moe.h), as transformers 5 splits it: every rank runs the router (and Qwen2-MoE's shared
// expert) on the whole activations, as plain tensors, and its slice of every expert's intermediate features
// (MoeTensorParallel: one all-reduce of the output). Between blocks the activations are `act` (Shard(1) under
// sequence parallel: gathered on the way in, this rank's part taken on the way out, no communication).
void add_sparse_mlps(const LlamaConfig& c, const std::optional<Placement>& act, ParallelizePlan& plan) {
  for (const auto& l : layers_where(c, true)) {
    const std::string mlp = "model.layers." + l + ".mlp";
    if (act) {
      plan.emplace_back(mlp, PrepareModuleInputOutput({.input_layouts = {*act}, .desired_input_layouts = {Replicate()},
                                                       .use_local_input = true, .output_layouts = Replicate(),
                                                       .desired_output_layouts = *act, .use_local_output = true}));
    }
    plan.emplace_back(mlp + ".experts", MoeTensorParallel());
  }
}

// The norms a layer has (model.h), and the final one: under sequence parallel each runs on the sequence
// shards of the residual stream or of a block's output, both Shard(1).
std::vector<std::string> norms(const LlamaConfig& c) {
  std::vector<std::string> out = {"model.norm"};
  if (c.norm.placement != LayerKind::post_norm) out.push_back("model.layers.*.input_layernorm");
  if (c.norm.placement != LayerKind::parallel) out.push_back("model.layers.*.post_attention_layernorm");
  if (c.norm.placement == LayerKind::sandwich) out.push_back("model.layers.*.pre_feedforward_layernorm");
  if (c.norm.placement == LayerKind::sandwich || c.norm.placement == LayerKind::post_norm) out.push_back("model.layers.*.post_feedforward_layernorm");
  return out;
}

}  // namespace

ParallelizePlan torchtitan_plan(const LlamaConfig& c, int64_t tp, const TPOptions& o) {
  check_sizes(c, tp, /*allow_replicated_kv=*/true);
  const Placement act = o.sequence_parallel ? Placement(Shard(1)) : Placement(Replicate());  // between blocks
  const Placement logits = o.loss_parallel ? Placement(Shard(-1)) : Placement(Replicate());
  // k, v: GQA heads replicated on the ranks that share them when the TP degree exceeds the kv heads.
  const HeadReplicatedColwiseParallel kv({.num_heads = c.num_key_value_heads, .head_dim = c.head_dim()});
  // Float8 tensorwise: the same layouts through the float8 styles (their sharded inputs gathered in float8).
  const auto rowwise_out = o.float8 ? ParallelStyleRef(Float8RowwiseParallel({.output_layouts = act}))
                                    : ParallelStyleRef(RowwiseParallel({.output_layouts = act}));
  const auto colwise = [&](ColwiseParallelOptions options) {
    return o.float8 ? ParallelStyleRef(Float8ColwiseParallel(options)) : ParallelStyleRef(ColwiseParallel(options));
  };
  const auto prepare_input = [&](PrepareModuleInputOptions options) {
    return o.float8 ? ParallelStyleRef(PrepareFloat8ModuleInput(options)) : ParallelStyleRef(PrepareModuleInput(options));
  };

  ParallelizePlan plan = {
      {"model.embed_tokens", RowwiseParallel({.input_layouts = Replicate(), .output_layouts = act})},
      {"lm_head", ColwiseParallel({.input_layouts = act, .output_layouts = logits, .use_local_output = !o.loss_parallel})},
      // (x, cos, sin, mask)
      {"model.layers.*.self_attn", prepare_input({.input_layouts = {act, Replicate(), Replicate(), Replicate()},
                                                  .desired_input_layouts = {Replicate(), Replicate(), Replicate(),
                                                                            Replicate()}})},
      {"model.layers.*.self_attn.q_proj", colwise({.use_local_output = false})},  // views see global shapes
      {"model.layers.*.self_attn.k_proj", kv},
      {"model.layers.*.self_attn.v_proj", kv},
      {"model.layers.*.self_attn.o_proj", rowwise_out},
  };
  for (const auto& l : layers_where(c, false)) {
    plan.emplace_back("model.layers." + l + ".mlp", prepare_input({.input_layouts = {act}, .desired_input_layouts = {Replicate()}}));
  }
  for (const auto& out : mlp_out(c)) plan.emplace_back(out, rowwise_out);
  for (const auto& in : mlp_in(c)) plan.emplace_back(in, colwise({}));
  add_sparse_mlps(c, act, plan);
  add_qk_norms(c, plan);
  if (o.sequence_parallel) {
    // A norm whose output joins the residual stream (Gemma's and OLMo2's post-norms) hands over its local
    // Shard(1) part, as o_proj and down_proj do; the others feed a block's PrepareModuleInput.
    for (const auto& norm : norms(c)) {
      const bool post = norm.find(".post_") != std::string::npos && c.norm.placement != LayerKind::pre_norm;
      plan.emplace_back(norm, SequenceParallel({.use_local_output = post}));
    }
  }
  return plan;
}

ParallelizePlan inference_plan(const LlamaConfig& c, int64_t tp) {
  check_sizes(c, tp, /*allow_replicated_kv=*/true);
  // k, v: their output, and so the KV cache, is Shard(1) by heads.
  const HeadReplicatedColwiseParallel kv({.num_heads = c.num_key_value_heads, .head_dim = c.head_dim()});
  // model.embed_tokens (untied) and the norms are not in the plan: their weights stay whole on every rank.
  ParallelizePlan plan = {
      // (x, cos, sin, mask): replicated plain tensors become Replicate DTensors
      {"model.layers.*.self_attn", PrepareModuleInput({.input_layouts = {Replicate(), Replicate(), Replicate(), Replicate()},
                                                       .desired_input_layouts = {Replicate(), Replicate(), Replicate(),
                                                                                 Replicate()}})},
      {"model.layers.*.self_attn.q_proj", ColwiseParallel({.use_local_output = false})},  // views into heads
      {"model.layers.*.self_attn.k_proj", kv},
      {"model.layers.*.self_attn.v_proj", kv},
      {"model.layers.*.self_attn.o_proj", RowwiseParallel()},  // Partial -> Replicate: all-reduce
      // Shard(-1) -> Replicate: one all-gather of [b, 1, vocab] per step
      {"lm_head", ColwiseParallel({.output_layouts = Replicate()})},
  };
  for (const auto& out : mlp_out(c)) plan.emplace_back(out, RowwiseParallel());  // Partial -> Replicate: all-reduce
  for (const auto& in : mlp_in(c)) plan.emplace_back(in, ColwiseParallel());
  add_sparse_mlps(c, std::nullopt, plan);  // activations plain and whole between blocks
  add_qk_norms(c, plan);
  // Tied: the vocab-parallel embedding shares lm_head's Shard(0) weight; its masked lookup is Partial ->
  // Replicate (one all-reduce of [b, s, hidden] per forward).
  if (c.tie_word_embeddings) plan.emplace_back("model.embed_tokens", RowwiseParallel({.input_layouts = Replicate()}));
  return plan;
}

ParallelizePlan hf_plan(const LlamaConfig& c, int64_t tp) {
  check_sizes(c, tp, /*allow_replicated_kv=*/false);
  // OLMo2's q/k norms span all heads: transformers gathers q/k/v whole and splits o_proj's input again.
  const bool gather = c.attention.qk_norm_full_width;
  std::vector<std::pair<std::string, std::string>> strings = {
      {"model.layers.*.self_attn.q_proj", gather ? "colwise_gather_output" : "colwise"},
      {"model.layers.*.self_attn.k_proj", gather ? "colwise_gather_output" : "colwise"},
      {"model.layers.*.self_attn.v_proj", gather ? "colwise_gather_output" : "colwise"},
      {"model.layers.*.self_attn.o_proj", gather ? "rowwise_split_input" : "rowwise"},
      {"lm_head", "colwise_rep"},
  };
  for (const auto& out : mlp_out(c)) strings.emplace_back(out, "rowwise");
  for (const auto& l : layers_where(c, true)) strings.emplace_back("model.layers." + l + ".mlp.experts", "moe_tp_experts");
  for (const auto& in : mlp_in(c)) strings.emplace_back(in, "colwise");
  ParallelizePlan plan = plan_from_strings(strings);
  if (c.attention.qk_norm) {
    // Qwen3's "replicated_with_grad_allreduce": q/k arrive as this rank's local heads, the local part of
    // Shard(2) of [b, s, heads, head_dim]; weight Replicate, output back to local heads.
    for (const char* norm : {"model.layers.*.self_attn.q_norm", "model.layers.*.self_attn.k_norm"}) {
      plan.emplace_back(norm, SequenceParallel({.sequence_dim = 2, .use_local_output = true}));
    }
  }
  // Tied: HF's "embedding_rowwise" (vocab-parallel embedding, output all-reduced) beside lm_head's Shard(0).
  if (c.tie_word_embeddings) plan.emplace_back("model.embed_tokens", RowwiseParallel({.input_layouts = Replicate()}));
  return plan;
}

std::vector<std::string> expert_plan_keys(const LlamaConfig& c) {
  std::vector<std::string> out;
  for (const auto& l : layers_where(c, true)) out.push_back("model.layers." + l + ".mlp.experts");
  return out;
}

}  // namespace llama
