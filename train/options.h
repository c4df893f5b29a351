// The training job's options (torchtitan's JobConfig): a plain config with built-in defaults, and the checks that
// tie its fields together. llama_train's command line binds them (tools/llama_train/options.h); the messages name
// the flags, which are the fields' names.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parallel_dims.h"
#include "dtensor/dp/mixed_precision.h"
#include "dtensor/float8/float8_linear.h"
#include "dtensor/peft/lora.h"
#include "train/data.h"
#include "llama/config.h"
#include "llama/parallelize.h"

namespace train {

// --mixed-precision (torchtitan's mixed_precision_param with mixed_precision_reduce float32): the parameters are fp32
// masters (AdamW's state, clipping and checkpoints in fp32), forward and backward compute in bf16 / fp16, gradients
// are reduced in fp32. off: everything in --dtype.
enum class MixedPrecision { off, bf16, fp16 };
std::string to_string(MixedPrecision mp);
MixedPrecision mixed_precision_from_string(const std::string& name);  // "bf16" | "fp16" | "off"; else ConfigError

struct TrainOptions {
  int64_t tp = 0;  // 0: the world size / dp
  int64_t dp = 1;  // data-parallel degree: world = dp * tp on a ("dp", "tp") mesh; each dp rank trains on batch / dp
  int64_t ep = 1;  // expert-parallel degree (a mixture of experts): ep divides dp; dp defaults to ep
  // Context parallelism: each sequence split over cp ranks (world = dp * cp * tp), ring attention by this rotation.
  int64_t cp = 1;
  std::string cp_rotate_method = "allgather";
  // Pipeline parallelism (torchtitan's pipeline_parallel_*; train/pipeline.h): the layers cut into pp stages (world =
  // pp * dp * cp * tp), each step's rows run as pp_microbatches microbatches (0: pp) in pp_schedule's order, the
  // stages cut at pp_split_points (layer indices "2,4"; "": torchtitan's even split).
  int64_t pp = 1;
  std::string pp_schedule = "1F1B";
  int64_t pp_microbatches = 0;
  std::string pp_split_points;
  models::DataParallel data_parallel = models::DataParallel::ddp;  // with dp > 1: replicate or fully_shard
  bool reshard_after_forward = true;  // fsdp: free gathered parameters after each block's forward
  bool fsdp_prefetch = true;          // fsdp: the next block's all-gather runs while this one computes
  llama::LlamaConfig model;
  // The parameters' dtype (models/common/dtype.h). With mixed precision off it is also the activations' and
  // gradients': "auto" is --hf-dir's config.json dtype, float32 for a random init. With mixed precision on the
  // parameters are fp32 masters ("auto" is float32 whatever the checkpoint holds; another dtype is a ConfigError).
  // The loss is computed in fp32 either way (as transformers upcasts the logits).
  std::string dtype = "auto";
  MixedPrecision mixed_precision = MixedPrecision::bf16;
  // --float8 (torchtitan's float8 converter): the decoder's Linear layers (not lm_head, not MoE routers) compute through
  // float8 matmuls with dynamic scales, in float8_recipe's granularity.
  bool float8 = false;
  dtensor::Float8Recipe float8_recipe = dtensor::Float8Recipe::tensorwise;
  // --float8-matmul: auto is resolved at start (llama_train times the kinds on the model's shapes, all ranks agreeing).
  dtensor::Float8MatmulKind float8_matmul = dtensor::Float8MatmulKind::auto_select;
  std::string hf_dir;  // fine-tune this HF checkpoint: `model` is its config.json, make_model loads its weights
  // Text --data through this tokenizer (train/tokenized_corpus.h): --tokenizer DIR, or hf_dir when it holds a
  // tokenizer.json. "": bytes are tokens.
  std::string tokenizer_dir;
  int64_t seq_len = 64;
  int64_t batch = 4;  // sequences per micro-batch (over all dp ranks: each takes batch / dp)
  // Sequences per optimizer step (torchtitan's global_batch_size): global_batch / batch micro-batches, their gradients
  // added up and reduced once (gradient accumulation). 0: batch (one micro-batch per step).
  int64_t global_batch = 0;
  // --activation-checkpoint none|full|selective, --selective-ac-option N (torchtitan's activation_checkpoint).
  llama::ActivationCheckpointConfig ac = {};
  // Evaluation (torchtitan's validation): the mean next-token loss over a held-out split, cut into consecutive windows
  // (load_corpus's formats, tokenized as --data). eval_every N: after every N steps and after the last; 0: after the
  // last only. eval_batches K: the first K batches of `batch` windows; 0: every whole batch of the split.
  std::string eval_data;
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  int64_t steps = 300;
  double lr = 3e-3;
  int64_t warmup = 20;
  double max_norm = 1.0;  // <= 0: no clipping
  uint64_t seed = 0;
  bool sequence_parallel = true;
  bool loss_parallel = true;
  bool async_tp = false;  // SP's all-gathers and reduce-scatters fused with their matmuls (needs SP, plan torchtitan)
  // --plan auto: llama_train searches the plan (train/plan_search.h) and sets plan, sequence_parallel,
  // loss_parallel, async_tp and data_parallel from the winner; memory_budget_mb bounds its peak per rank.
  bool plan_auto = false;
  int64_t memory_budget_mb = 0;
  // Gradients reduced to their parameters' placements once per backward (dtensor/dp/gradient_sync.h);
  // off: PyTorch's behaviour (Partial gradients, reduced by every op that reads them).
  bool gradient_sync = true;
  llama::TPPlan plan = llama::TPPlan::torchtitan;
  std::string device = "cpu";       // or "cuda": the mesh's device type (the model and batches move there)
  std::string data;                 // "": the default corpus
  int64_t log_every = 10;
  bool comm_detail = false;  // a `comm` line per logged step: collectives by type and bytes
  std::string checkpoint_dir;    // "": no checkpoints (checkpointing.h)
  int64_t checkpoint_every = 0;  // save after every N steps and after the last one (needs checkpoint_dir)
  bool resume = false;           // continue from the newest checkpoint in checkpoint_dir (none: from step 0)
  int64_t stop_after = 0;        // 0: run to `steps`; else stop after this step (the schedule still spans `steps`)
  std::string save_hf;           // "": none; else the trained model saved there as a HF checkpoint (train/export.h)
  // LoRA (PEFT's LoraConfig; dtensor/peft/lora.h): lora_rank > 0 freezes the model's weights (--hf-dir's mapped in
  // place, in their dtype: never widened to fp32 masters) and trains adapters in fp32 on lora_targets, sharded to match
  // each layer's TP style. --save-hf then writes the adapter (PEFT's adapter_model.safetensors + adapter_config.json),
  // or with merge_lora the merged model as a HF checkpoint. Checkpoints hold the adapters and their optimizer state.
  int64_t lora_rank = 0;
  double lora_alpha = 8;                                          // PEFT's default
  std::vector<std::string> lora_targets = {"q_proj", "v_proj"};  // PEFT's default for Llama
  double lora_dropout = 0;
  bool use_rslora = false;
  std::string lora_adapter;  // start from this PEFT adapter directory: its adapter_config.json is the LoRA config
  bool merge_lora = false;
  bool lora() const { return lora_rank > 0; }
};

// Options that do not fit together (or a checkpoint config that does not load): llama_train prints "error: <what>"
// on rank 0 and exits 2 on every rank, as for a bad flag.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// options.dtype resolved ("auto": float32 under mixed precision, else --hf-dir's config.json dtype or float32); a
// dtype the device cannot compute in, or masters in another dtype than fp32 under mixed precision, is a ConfigError.
at::ScalarType param_dtype(const TrainOptions& options);
// The policy --mixed-precision stands for: {param_dtype bf16, reduce_dtype fp32}; nullopt when off. fp16 is a
// ConfigError (it needs loss scaling).
std::optional<dtensor::MixedPrecisionPolicy> mp_policy(const TrainOptions& options);
// The dtype the matmuls run in: mixed precision's, else the parameters'.
at::ScalarType compute_dtype(const TrainOptions& options);

// After the fields are set: checks that they fit together (async TP needs SP and the torchtitan plan, --ep divides
// --dp and the experts, ...), turns SP and loss parallel off under the hf plan, takes --hf-dir's config.json as
// the model and its tokenizer.json as the tokenizer when none is named, and validates the model. Throws ConfigError.
void resolve_options(TrainOptions& options);
// Checks the values that need the world size (dp * tp == world, heads / seq_len by tp, batch by dp).
// Throws ConfigError.
void check_options(const TrainOptions& options, int64_t world_size);
// Fits the model to the corpus: a .bin corpus sets the vocabulary (its largest id + 1, rounded up to a
// multiple of 128 so that TP degrees divide it); a byte corpus must fit the vocabulary and every corpus must
// hold a sequence. Throws ConfigError.
void fit_to_corpus(TrainOptions& options, const Corpus& corpus);
// Micro-batches per optimizer step: global_batch / batch (1 when global_batch is 0).
int64_t gradient_accumulation_steps(const TrainOptions& options);
// The held-out split against the model: its ids within the vocabulary, and at least one batch of windows. Throws
// ConfigError naming --eval-data.
void fit_eval_corpus(const TrainOptions& options, const Corpus& eval);
// The adapters --lora-* stand for (nullopt without LoRA), for llama::build_model.
std::optional<dtensor::peft::LoraConfig> lora_config(const TrainOptions& options);
// The TP degree: options.tp, or world / dp when 0.
int64_t tp_degree(const TrainOptions& options, int64_t world_size);
// The options' parallelism: the degrees over a world of `world_size` ranks (no mesh yet: build_mesh makes it),
// and what parallelize_llama applies on each dim.
models::ParallelDims parallel_dims(const TrainOptions& options, int64_t world_size);
llama::ParallelizeConfig parallelize_config(const TrainOptions& options);

}  // namespace train
