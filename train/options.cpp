#include "train/options.h"

#include "tokenizer/tokenizer.h"

#include "dtensor/cp/context_parallel.h"
#include "train/pipeline.h"
#include "dtensor/peft/adapter.h"

#include <ATen/ATen.h>

#include "common/dtype.h"

#include "llama/hf_config.h"

#include <filesystem>
#include <algorithm>

namespace train {
namespace {
c10::Device compute_device(const TrainOptions& o) { return o.device == "cuda" ? c10::Device(at::kCUDA) : c10::Device(at::kCPU); }

// --lora-adapter's config taken as the run's; what LoRA does not compose with refused by name.
void resolve_lora(TrainOptions& o) {
  if (!o.lora_adapter.empty()) {
    if (o.lora()) {
      throw ConfigError("--lora-rank with --lora-adapter: the adapter's adapter_config.json gives r, lora_alpha and "
                        "target_modules");
    }
    try {
      const dtensor::peft::LoraConfig c = dtensor::peft::load_adapter_config(o.lora_adapter);
      o.lora_rank = c.r, o.lora_alpha = c.lora_alpha, o.lora_targets = c.target_modules;
      o.lora_dropout = c.lora_dropout, o.use_rslora = c.use_rslora;
    } catch (const std::exception& e) {
      throw ConfigError(std::string("--lora-adapter: ") + e.what());
    }
  }
  if (o.merge_lora && !o.lora()) throw ConfigError("--merge-lora needs LoRA (--lora-rank or --lora-adapter)");
  if (o.merge_lora && o.save_hf.empty()) throw ConfigError("--merge-lora needs --save-hf DIR (where the merged model goes)");
  if (!o.lora()) return;
  try {
    dtensor::peft::validate(*lora_config(o));
  } catch (const std::exception& e) {
    throw ConfigError(std::string("--lora-*: ") + e.what());
  }
  if (o.float8) throw ConfigError("--float8 with LoRA: adapters on float8 layers are not supported");
  if (o.async_tp) throw ConfigError("--async-tp with LoRA: async TP's fused matmuls would skip the adapters");
  if (o.plan_auto) throw ConfigError("--plan auto with LoRA: the plan search does not cost adapters yet (name a plan)");
  if (o.data_parallel == models::DataParallel::fsdp && o.dp > 1) {
    throw ConfigError("--fsdp with LoRA: FSDP over a frozen base is not supported yet (use DDP: --dp N without --fsdp)");
  }
}
}  // namespace

void resolve_options(TrainOptions& o) {
  if (o.memory_budget_mb > 0 && !o.plan_auto) throw ConfigError("--memory-budget-mb needs --plan auto");
  if (o.plan != llama::TPPlan::torchtitan && o.plan != llama::TPPlan::hf) {
    throw ConfigError("--plan " + llama::to_string(o.plan) + " is generation's plan; training takes torchtitan, hf or auto");
  }
  if (o.async_tp && o.plan == llama::TPPlan::hf) throw ConfigError("--async-tp needs --plan torchtitan (the hf plan has no sequence parallel)");
  if (o.plan == llama::TPPlan::hf) o.sequence_parallel = o.loss_parallel = false;
  if (o.async_tp && !o.sequence_parallel) {
    throw ConfigError("--async-tp needs sequence parallel (it fuses SP's all-gathers and reduce-scatters with the matmuls)");
  }
  if (o.global_batch > 0 && o.global_batch % o.batch != 0) {
    throw ConfigError("--global-batch " + std::to_string(o.global_batch) + " is not a multiple of --batch " +
                      std::to_string(o.batch) + " (each optimizer step takes global-batch / batch micro-batches of --batch)");
  }
  if ((o.eval_every > 0 || o.eval_batches > 0) && o.eval_data.empty()) {
    throw ConfigError(std::string(o.eval_every > 0 ? "--eval-every" : "--eval-batches") + " needs --eval-data");
  }
  if ((o.checkpoint_every > 0 || o.resume) && o.checkpoint_dir.empty()) {
    throw ConfigError(std::string(o.resume ? "--resume" : "--checkpoint-every") + " needs --checkpoint-dir");
  }
  if (o.tokenizer_dir.empty() && !o.hf_dir.empty() && std::filesystem::exists(std::filesystem::path(o.hf_dir) / "tokenizer.json")) {
    o.tokenizer_dir = o.hf_dir;
  }
  try {
    if (!o.hf_dir.empty()) o.model = llama::config_from_hf_json((std::filesystem::path(o.hf_dir) / "config.json").string());
    o.model.validate();
  } catch (const std::exception& e) {
    throw ConfigError(e.what());
  }
  resolve_lora(o);
  param_dtype(o);  // a dtype we compute in, before any communication
  if (const auto policy = mp_policy(o)) {  // fp16 is refused there
    try {
      models::check_computable(*policy->param_dtype, compute_device(o));
    } catch (const std::exception& e) {
      throw ConfigError(std::string("--mixed-precision: ") + e.what());
    }
  }
  if (o.float8) {
    if (o.async_tp) throw ConfigError("--float8 with --async-tp: async TP's fused matmuls are not float8 (use one of them)");
    if (o.plan_auto) throw ConfigError("--float8 with --plan auto: the plan search does not cost float8 matmuls yet (name a plan)");
    const c10::Device d = compute_device(o);
    // A float8 GEMM on the device, tried where it will run: a GPU before Ada / Hopper has none (a CPU emulates it).
    const auto kind = o.float8_matmul;
    if (kind == dtensor::Float8MatmulKind::scaled_mm || (kind == dtensor::Float8MatmulKind::auto_select && !d.is_cpu())) try {
      const at::Tensor a = at::ones({16, 16}, at::TensorOptions(d)).to(at::kFloat8_e4m3fn);
      const at::Tensor one = at::ones({}, at::TensorOptions(d).dtype(at::kFloat));
      at::_scaled_mm(a, a.t(), one, one, std::nullopt, std::nullopt, at::kFloat).sum().item<double>();
    } catch (const std::exception& e) {
      throw ConfigError(std::string("--float8: ") + o.device + " cannot run float8 matmuls (at::_scaled_mm): " + e.what());
    }
  }
  if (o.ep > 1) {
    if (o.dp % o.ep != 0) {
      throw ConfigError("--ep " + std::to_string(o.ep) + " does not divide --dp " + std::to_string(o.dp) +
                       " (expert parallelism borrows data-parallel ranks)");
    }
    if (o.data_parallel == models::DataParallel::fsdp) throw ConfigError("--fsdp with --ep: FSDP beside expert parallelism is not supported (use --ddp)");
    if (o.model.moe.num_experts == 0) throw ConfigError("--ep needs a mixture of experts (--hf-dir of a Mixtral or Qwen-MoE checkpoint); this model is dense");
    if (o.model.moe.num_experts % o.ep != 0) {
      throw ConfigError("--ep " + std::to_string(o.ep) + " does not divide the " + std::to_string(o.model.moe.num_experts) +
                       " experts (experts are not split)");
    }
  }
}

std::string to_string(MixedPrecision mp) {
  switch (mp) {
    case MixedPrecision::bf16: return "bf16";
    case MixedPrecision::fp16: return "fp16";
    case MixedPrecision::off: break;
  }
  return "off";
}

MixedPrecision mixed_precision_from_string(const std::string& name) {
  for (MixedPrecision mp : {MixedPrecision::bf16, MixedPrecision::fp16, MixedPrecision::off}) {
    if (to_string(mp) == name) return mp;
  }
  throw ConfigError("--mixed-precision '" + name + "' is not bf16, fp16 or off");
}

at::ScalarType param_dtype(const TrainOptions& o) {
  at::ScalarType dtype;
  // LoRA under mixed precision: the frozen base is held in the compute dtype itself (bf16), the adapters are the fp32
  // masters. Without LoRA, mixed precision keeps fp32 masters whatever the checkpoint stores (bf16 widened on load).
  const bool lora_mp = o.lora() && o.mixed_precision == MixedPrecision::bf16;
  try {
    const bool masters = o.mixed_precision != MixedPrecision::off && !o.lora();
    const std::string stored = o.hf_dir.empty() || masters ? "" : llama::checkpoint_dtype((std::filesystem::path(o.hf_dir) / "config.json").string());
    dtype = models::resolve_dtype(lora_mp && o.dtype == "auto" ? "bfloat16" : o.dtype, stored);
    models::check_computable(dtype, compute_device(o));
  } catch (const std::exception& e) {
    throw ConfigError(std::string("--dtype: ") + e.what());
  }
  if (lora_mp && dtype != at::kBFloat16) {
    throw ConfigError("--dtype " + o.dtype + " with LoRA and --mixed-precision bf16: the frozen base is held in bfloat16 "
                      "(for a base in " + o.dtype + ", add --mixed-precision off)");
  }
  if (o.mixed_precision != MixedPrecision::off && !o.lora() && dtype != at::kFloat) {
    throw ConfigError("--dtype " + o.dtype + " with --mixed-precision " + to_string(o.mixed_precision) +
                      ": mixed precision keeps the parameters as float32 masters and computes in " +
                      to_string(o.mixed_precision) + " (for parameters stored in " + o.dtype +
                      " as well, add --mixed-precision off)");
  }
  return dtype;
}

std::optional<dtensor::MixedPrecisionPolicy> mp_policy(const TrainOptions& o) {
  if (o.mixed_precision == MixedPrecision::off) return std::nullopt;
  if (o.mixed_precision == MixedPrecision::fp16) {
    // fp16's 5-bit exponent underflows small gradients unless the loss is scaled (PyTorch's GradScaler), which
    // llama_train does not do: refused rather than trained silently wrong.
    throw ConfigError("--mixed-precision fp16 needs dynamic loss scaling (PyTorch's GradScaler), which llama_train does "
                      "not implement; use --mixed-precision bf16 (fp32's range, no scaling needed)");
  }
  if (o.lora()) return std::nullopt;  // the base already in bf16 (param_dtype), the adapters' branch in fp32 as PEFT's
  return dtensor::MixedPrecisionPolicy{.param_dtype = at::kBFloat16, .reduce_dtype = at::kFloat, .output_dtype = std::nullopt};
}

at::ScalarType compute_dtype(const TrainOptions& o) {
  const auto policy = mp_policy(o);
  return policy ? *policy->param_dtype : param_dtype(o);
}

void fit_to_corpus(TrainOptions& o, const Corpus& corpus) {
  const int64_t max_token = corpus.max_token();
  if (!o.data.empty() && o.data.ends_with(".bin") && o.hf_dir.empty() && o.tokenizer_dir.empty()) {
    o.model.vocab_size = (max_token + 1 + 127) / 128 * 128;  // a multiple of 128: divisible by the TP degree
  } else if (o.hf_dir.empty() && !o.tokenizer_dir.empty()) {
    // A new model over a tokenizer: a row per token of the tokenizer (len(tokenizer), as transformers sizes one),
    // padded to a multiple of 128 (divisible by the TP degree), so that its own text can be served.
    int64_t tokens = max_token + 1;
    try {
      tokens = std::max(tokens, tokenizer::Tokenizer::from_pretrained(o.tokenizer_dir).vocab_size());
    } catch (const std::exception& e) {
      throw ConfigError("--tokenizer " + o.tokenizer_dir + ": " + e.what());
    }
    o.model.vocab_size = (tokens + 127) / 128 * 128;
  } else if (max_token >= o.model.vocab_size) {
    throw ConfigError("token id " + std::to_string(max_token) + " >= vocab " + std::to_string(o.model.vocab_size));
  }
  if (corpus.tokens.numel() < o.seq_len + 2) {
    throw ConfigError("--seq-len " + std::to_string(o.seq_len) + " is too long for the corpus (" +
                     std::to_string(corpus.tokens.numel()) + " tokens)");
  }
}

void fit_eval_corpus(const TrainOptions& o, const Corpus& eval) {
  const int64_t max_token = eval.max_token();
  if (max_token >= o.model.vocab_size) {
    throw ConfigError("--eval-data " + eval.source + ": token id " + std::to_string(max_token) + " >= vocab " +
                      std::to_string(o.model.vocab_size));
  }
  try {
    eval_batches(eval, o.batch, o.seq_len, 1);
  } catch (const std::exception& e) {
    throw ConfigError(e.what());
  }
}

int64_t tp_degree(const TrainOptions& o, int64_t world) {
  return o.tp ? o.tp : std::max<int64_t>(1, world / (o.pp * o.dp * o.cp));
}

models::ParallelDims parallel_dims(const TrainOptions& o, int64_t world) {
  models::ParallelDims dims;
  dims.dp = o.dp;
  dims.ep = o.ep;
  dims.cp = o.cp;
  dims.pp = o.pp;
  dims.tp = tp_degree(o, world);
  dims.data_parallel = o.data_parallel;
  dims.device = o.device;
  return dims;
}

llama::ParallelizeConfig parallelize_config(const TrainOptions& o) {
  return {.plan = o.plan,
          .tp = {.sequence_parallel = o.sequence_parallel, .loss_parallel = o.loss_parallel, .async_tp = o.async_tp},
          .gradient_sync = o.gradient_sync,
          .fsdp = {.reshard_after_forward = o.reshard_after_forward, .prefetch = o.fsdp_prefetch},
          .mp_policy = mp_policy(o),
          .float8 = o.float8 ? std::optional<dtensor::Float8LinearConfig>({.recipe = o.float8_recipe, .matmul = o.float8_matmul})
                            : std::nullopt,
          .ac = o.ac};
}

std::optional<dtensor::peft::LoraConfig> lora_config(const TrainOptions& o) {
  if (!o.lora()) return std::nullopt;
  return dtensor::peft::LoraConfig{.r = o.lora_rank, .lora_alpha = o.lora_alpha, .target_modules = o.lora_targets,
                                   .lora_dropout = o.lora_dropout, .use_rslora = o.use_rslora};
}

int64_t gradient_accumulation_steps(const TrainOptions& o) { return o.global_batch > 0 ? o.global_batch / o.batch : 1; }

namespace {

// --pp beside the rest: what the pipeline carries today, and the refusals of what it does not.
void check_pipeline_options(const TrainOptions& o) {
  dtensor::pp::ScheduleSpec spec;
  try {
    spec = pipeline_spec(o);
    pipeline_stage_layers(o, 0);  // the split fits the model's layers
  } catch (const std::exception& e) {
    throw ConfigError(std::string("--pp ") + std::to_string(o.pp) + ": " + e.what());
  }
  const int64_t rows = o.batch / o.dp * gradient_accumulation_steps(o);
  if (rows % spec.microbatches != 0) {
    throw ConfigError("--pp-microbatches " + std::to_string(spec.microbatches) + " does not divide a dp rank's " +
                      std::to_string(rows) + " rows per step (--batch / --dp x the gradient accumulation steps)");
  }
  auto refuse = [&](bool when, const std::string& what) {
    if (when) throw ConfigError("--pp " + std::to_string(o.pp) + " with " + what + " is not supported yet");
  };
  refuse(spec.kind == dtensor::pp::ScheduleKind::Interleaved1F1B,
         "--pp-schedule Interleaved1F1B (llama_train runs one stage per rank: GPipe, 1F1B or ZBH1)");
  refuse(o.cp > 1, "--cp (a stage's positions under context parallelism)");
  refuse(o.model.moe.num_experts > 0, "a mixture of experts (the routers' auxiliary loss spans the stages)");
  refuse(!o.eval_data.empty(), "--eval-data (a forward-only pipeline step)");
  refuse(!o.save_hf.empty(), "--save-hf (each stage saving its part)");
  refuse(o.async_tp, "--async-tp");
  refuse(o.plan_auto, "--plan auto (the plan search knows no pipeline yet)");
  if (o.model.tie_word_embeddings) {
    throw ConfigError("--pp " + std::to_string(o.pp) + ": this model ties lm_head to embed_tokens (tie_word_embeddings), "
                      "which would sit on the first and the last stage; pipeline parallelism needs untied embeddings");
  }
}

}  // namespace

void check_options(const TrainOptions& o, int64_t world) {
  const int64_t tp = tp_degree(o, world);
  if (o.pp * o.dp * o.cp * tp != world) {
    const std::string pp = o.pp > 1 ? "--pp " + std::to_string(o.pp) + " x " : "";
    const std::string cp = o.cp > 1 ? " x --cp " + std::to_string(o.cp) : "";
    throw ConfigError(pp + "--dp " + std::to_string(o.dp) + cp + " x --tp " + std::to_string(tp) + " != world size " +
                     std::to_string(world) + " (run with --nproc-per-node " + std::to_string(o.pp * o.dp * o.cp * tp) + ")");
  }
  if (o.pp > 1) check_pipeline_options(o);
  if (o.cp > 1) {
    // Load balancing cuts each sequence into 2 * cp chunks; sequence parallel then cuts a rank's share over tp.
    const int64_t divisor = 2 * o.cp * (o.sequence_parallel ? tp : 1);
    if (o.seq_len % divisor != 0) {
      throw ConfigError("--seq-len " + std::to_string(o.seq_len) + " is not divisible by " +
                        (o.sequence_parallel && tp > 1 ? "tp * 2 * cp = " : "2 * cp = ") + std::to_string(divisor) +
                        " (context parallel's load balancing cuts each sequence into 2 * cp chunks" +
                        (o.sequence_parallel && tp > 1 ? ", and sequence parallel a rank's share over tp)" : ")"));
    }
    try {
      dtensor::cp::rotate_method_from_string(o.cp_rotate_method);
    } catch (const std::exception& e) {
      throw ConfigError(std::string("--cp-rotate-method: ") + e.what());
    }
    if (o.ep > 1) throw ConfigError("--cp with --ep: context parallelism beside expert parallelism is not supported");
    if (o.model.moe.num_experts > 0) {
      throw ConfigError("--cp with a mixture of experts: context parallelism beside routed experts is not supported");
    }
  }
  if (o.lora() && o.lora_dropout > 0 && tp > 1) {
    throw ConfigError("--lora-dropout with --tp > 1: the ranks of a replicated input would draw different masks "
                      "(use --lora-dropout 0 under TP)");
  }
  if (o.batch % o.dp != 0) {
    throw ConfigError("--batch " + std::to_string(o.batch) + " is not divisible by --dp " + std::to_string(o.dp) +
                     " (each dp rank takes batch / dp sequences)");
  }
  if (o.sequence_parallel && o.seq_len % tp != 0) {
    throw ConfigError("--seq-len " + std::to_string(o.seq_len) + " is not divisible by the TP degree " + std::to_string(tp) +
                     " (sequence parallel shards the sequence)");
  }
}

}  // namespace train
