#include "train/options.h"

#include "llama/hf_config.h"

#include <charconv>
#include <filesystem>
#include <functional>
#include <algorithm>
#include <map>
#include <sstream>

namespace train {
namespace {

using tools_cli::parse_number;
using tools_cli::positive;

}  // namespace

std::string help_text() {
  TrainOptions d;
  std::ostringstream s;
  s << "llama_train: trains a Llama-3-style model under tensor parallelism (torchtitan's TP + SP plan).\n"
    << "  tprun --nproc-per-node 2 llama_train [options]\n\n"
    << "  --tp N                    TP degree (default: the world size / dp)\n"
    << "  --dp N                    data-parallel degree on a (dp, tp) mesh, world = dp * tp (default 1);\n"
    << "                            each dp rank trains on its batch / dp sequences of the global batch\n"
    << "  --ep N                    expert parallelism (a mixture of experts): the experts split over N of the\n"
    << "                            dp ranks, tokens sent to them by all_to_all (--dp defaults to N; DDP only)\n"
    << "  --ddp / --fsdp            the data-parallel kind: replicate (DDP, default) or fully_shard (FSDP2)\n"
    << "  --no-reshard-after-forward  fsdp: keep each block's gathered parameters from forward to backward\n"
    << "  --no-fsdp-prefetch        fsdp: gather each block when it runs (default: the next block's all-gather\n"
    << "                            runs while this one computes)\n"
    << "  --hf-dir DIR              fine-tune a Hugging Face checkpoint (llama, mistral, qwen2, qwen3): its\n"
    << "                            config.json is the model (no size flags then), its weights the start\n"
    << "  --tokenizer DIR           tokenize text --data with this HF tokenizer (default: --hf-dir's tokenizer.json,\n"
    << "                            else bytes are tokens); tokenized once into a cache, with a progress bar\n"
    << "  --dim N                   hidden size (default " << d.model.hidden_size << ")\n"
    << "  --layers N                decoder layers (default " << d.model.num_hidden_layers << ")\n"
    << "  --heads N                 query heads (default " << d.model.num_attention_heads << ")\n"
    << "  --kv-heads N              key/value heads (default " << d.model.num_key_value_heads << ")\n"
    << "  --ffn-dim N               SwiGLU hidden size (default " << d.model.intermediate_size << ")\n"
    << "  --seq-len N               tokens per sequence (default " << d.seq_len << ")\n"
    << "  --batch N                 sequences per step (default " << d.batch << ")\n"
    << "  --steps N                 optimizer steps (default " << d.steps << ")\n"
    << "  --lr X                    peak AdamW learning rate (default " << d.lr << ")\n"
    << "  --warmup N                linear warmup steps, then cosine decay to 10% (default " << d.warmup << ")\n"
    << "  --max-norm X              gradient clipping norm, 0 = off (default " << d.max_norm << ")\n"
    << "  --seed N                  weights and batches (default " << d.seed << ")\n"
    << "  --sequence-parallel / --no-sequence-parallel   (default on)\n"
    << "  --loss-parallel / --no-loss-parallel           (default on)\n"
    << "  --async-tp                SP's all-gathers and reduce-scatters fused with their matmuls, pipelined\n"
    << "                            (async TP; needs sequence parallel; default off)\n"
    << "  --gradient-sync / --no-gradient-sync           reduce gradients once after backward (default on)\n"
    << "  --device cpu|cuda         where the model runs (default " << d.device << "; cuda: cuda:LOCAL_RANK, NCCL between\n"
    << "                            ranks, or DTENSOR_CUDA_BACKEND=gloo when ranks share a GPU)\n"
    << "  --plan torchtitan|hf|auto the TP plan (default " << llama::to_string(d.plan) << "; hf: no sequence or loss parallel;\n"
    << "                            auto: searched (llama_plan --search), which also sets SP, loss parallel, async TP\n"
    << "                            and FSDP / DDP, overriding their flags)\n"
    << "  --memory-budget-mb M      with --plan auto: the per-rank peak memory the plan must fit\n"
    << "  --data FILE               text file (bytes are tokens) or nanoGPT .bin of uint16 ids\n"
    << "                            (default: the texts in /usr/share/common-licenses)\n"
    << "  --log-every N             progress line every N steps (default " << d.log_every << ")\n"
    << "  --comm-detail             a `comm` line per logged step: collectives by type, count and bytes\n"
    << "  --checkpoint-dir DIR      checkpoints go to DIR/step-NNNNNNNN (any TP degree can resume them;\n"
    << "                            llama_generate --checkpoint DIR speaks from the newest)\n"
    << "  --checkpoint-every N      save after every N steps and after the last step\n"
    << "  --resume                  continue from the newest checkpoint in --checkpoint-dir (none: start fresh)\n"
    << "  --stop-after K            stop after step K, as an interrupted run (the schedule still spans --steps)\n"
    << "  --help\n";
  return s.str();
}

TrainOptions parse_options(const std::vector<std::string>& args, bool& help) {
  TrainOptions o;
  help = false;
  std::string size_flag;  // the last model-size flag given: --hf-dir brings its own sizes
  bool dp_given = false;  // --ep sets dp to ep when --dp is not given
  auto size = [&](const char* name, int64_t& field) {
    return [&, name](const std::string& v) {
      field = positive(name, v);
      size_flag = name;
    };
  };
  const tools_cli::ValuedOptions valued = {
      {"hf-dir", [&](const std::string& v) { o.hf_dir = v; }},
      {"tokenizer", [&](const std::string& v) {
         if (!std::filesystem::exists(std::filesystem::path(v) / "tokenizer.json")) {
           throw UsageError("--tokenizer: no tokenizer.json in '" + v + "'");
         }
         o.tokenizer_dir = v;
       }},
      {"tp", [&](const std::string& v) { o.tp = positive("tp", v); }},
      {"dp", [&](const std::string& v) { o.dp = positive("dp", v); dp_given = true; }},
      {"ep", [&](const std::string& v) { o.ep = positive("ep", v); }},
      {"dim", size("dim", o.model.hidden_size)},
      {"layers", size("layers", o.model.num_hidden_layers)},
      {"heads", size("heads", o.model.num_attention_heads)},
      {"kv-heads", size("kv-heads", o.model.num_key_value_heads)},
      {"ffn-dim", size("ffn-dim", o.model.intermediate_size)},
      {"seq-len", [&](const std::string& v) { o.seq_len = positive("seq-len", v); }},
      {"batch", [&](const std::string& v) { o.batch = positive("batch", v); }},
      {"steps", [&](const std::string& v) { o.steps = positive("steps", v); }},
      {"lr", [&](const std::string& v) {
         o.lr = parse_number<double>("lr", v);
         if (!(o.lr > 0)) throw UsageError("--lr must be positive, got " + v);
       }},
      {"warmup", [&](const std::string& v) {
         o.warmup = parse_number<int64_t>("warmup", v);
         if (o.warmup < 0) throw UsageError("--warmup must not be negative, got " + v);
       }},
      {"max-norm", [&](const std::string& v) {
         o.max_norm = parse_number<double>("max-norm", v);
         if (o.max_norm < 0) throw UsageError("--max-norm must not be negative, got " + v);
       }},
      {"seed", [&](const std::string& v) { o.seed = parse_number<uint64_t>("seed", v); }},
      {"device", [&](const std::string& v) {
         if (v != "cpu" && v != "cuda") throw UsageError("--device must be cpu or cuda, got '" + v + "'");
         o.device = v;
       }},
      {"plan", [&](const std::string& v) {
         if (v != "torchtitan" && v != "hf" && v != "auto") {
           throw UsageError("--plan must be torchtitan, hf or auto, got '" + v + "'");
         }
         o.plan_auto = v == "auto";
         if (!o.plan_auto) o.plan = llama::tp_plan_from_string(v);
       }},
      {"memory-budget-mb", [&](const std::string& v) { o.memory_budget_mb = positive("memory-budget-mb", v); }},
      {"data", [&](const std::string& v) {
         if (!std::filesystem::is_regular_file(v)) throw UsageError("--data: no such file '" + v + "'");
         o.data = v;
       }},
      {"log-every", [&](const std::string& v) { o.log_every = positive("log-every", v); }},
      {"checkpoint-dir", [&](const std::string& v) {
         if (v.empty()) throw UsageError("--checkpoint-dir needs a directory");
         o.checkpoint_dir = v;
       }},
      {"checkpoint-every", [&](const std::string& v) { o.checkpoint_every = positive("checkpoint-every", v); }},
      {"stop-after", [&](const std::string& v) { o.stop_after = positive("stop-after", v); }},
  };
  const tools_cli::FlagOptions flags = {
      {"sequence-parallel", [&] { o.sequence_parallel = true; }},
      {"no-sequence-parallel", [&] { o.sequence_parallel = false; }},
      {"async-tp", [&] { o.async_tp = true; }},
      {"no-async-tp", [&] { o.async_tp = false; }},
      {"loss-parallel", [&] { o.loss_parallel = true; }},
      {"no-loss-parallel", [&] { o.loss_parallel = false; }},
      {"gradient-sync", [&] { o.gradient_sync = true; }},
      {"no-gradient-sync", [&] { o.gradient_sync = false; }},
      {"comm-detail", [&] { o.comm_detail = true; }},
      {"resume", [&] { o.resume = true; }},
      {"ddp", [&] { o.data_parallel = models::DataParallel::ddp; }},
      {"fsdp", [&] { o.data_parallel = models::DataParallel::fsdp; }},
      {"reshard-after-forward", [&] { o.reshard_after_forward = true; }},
      {"no-reshard-after-forward", [&] { o.reshard_after_forward = false; }},
      {"fsdp-prefetch", [&] { o.fsdp_prefetch = true; }},
      {"no-fsdp-prefetch", [&] { o.fsdp_prefetch = false; }},
      {"help", [&] { help = true; }},
  };
  tools_cli::parse_args(args, valued, flags);
  if (o.memory_budget_mb > 0 && !o.plan_auto) throw UsageError("--memory-budget-mb needs --plan auto");
  if (o.async_tp && o.plan == llama::TPPlan::hf) throw UsageError("--async-tp needs --plan torchtitan (the hf plan has no sequence parallel)");
  if (o.plan == llama::TPPlan::hf) o.sequence_parallel = o.loss_parallel = false;
  if (o.async_tp && !o.sequence_parallel) {
    throw UsageError("--async-tp needs sequence parallel (it fuses SP's all-gathers and reduce-scatters with the matmuls)");
  }
  if ((o.checkpoint_every > 0 || o.resume) && o.checkpoint_dir.empty()) {
    throw UsageError(std::string(o.resume ? "--resume" : "--checkpoint-every") + " needs --checkpoint-dir");
  }
  if (o.tokenizer_dir.empty() && !o.hf_dir.empty() && std::filesystem::exists(std::filesystem::path(o.hf_dir) / "tokenizer.json")) {
    o.tokenizer_dir = o.hf_dir;
  }
  if (!o.hf_dir.empty() && !size_flag.empty()) {
    throw UsageError("--" + size_flag + " with --hf-dir: the checkpoint's config.json gives the model's sizes");
  }
  try {
    if (!o.hf_dir.empty()) o.model = llama::config_from_hf_json((std::filesystem::path(o.hf_dir) / "config.json").string());
    o.model.validate();
  } catch (const std::exception& e) {
    throw UsageError(e.what());
  }
  if (o.ep > 1) {
    if (!dp_given) o.dp = o.ep;
    if (o.dp % o.ep != 0) {
      throw UsageError("--ep " + std::to_string(o.ep) + " does not divide --dp " + std::to_string(o.dp) +
                       " (expert parallelism borrows data-parallel ranks)");
    }
    if (o.data_parallel == models::DataParallel::fsdp) throw UsageError("--fsdp with --ep: FSDP beside expert parallelism is not supported (use --ddp)");
    if (o.model.moe.num_experts == 0) throw UsageError("--ep needs a mixture of experts (--hf-dir of a Mixtral or Qwen-MoE checkpoint); this model is dense");
    if (o.model.moe.num_experts % o.ep != 0) {
      throw UsageError("--ep " + std::to_string(o.ep) + " does not divide the " + std::to_string(o.model.moe.num_experts) +
                       " experts (experts are not split)");
    }
  }
  return o;
}

void fit_to_corpus(TrainOptions& o, const Corpus& corpus) {
  const int64_t max_token = corpus.max_token();
  if (!o.data.empty() && o.data.ends_with(".bin") && o.hf_dir.empty() && o.tokenizer_dir.empty()) {
    o.model.vocab_size = (max_token + 1 + 127) / 128 * 128;  // a multiple of 128: divisible by the TP degree
  } else if (max_token >= o.model.vocab_size) {
    throw UsageError("token id " + std::to_string(max_token) + " >= vocab " + std::to_string(o.model.vocab_size));
  }
  if (corpus.tokens.numel() < o.seq_len + 2) {
    throw UsageError("--seq-len " + std::to_string(o.seq_len) + " is too long for the corpus (" +
                     std::to_string(corpus.tokens.numel()) + " tokens)");
  }
}

int64_t tp_degree(const TrainOptions& o, int64_t world) { return o.tp ? o.tp : std::max<int64_t>(1, world / o.dp); }

models::ParallelDims parallel_dims(const TrainOptions& o, int64_t world) {
  models::ParallelDims dims;
  dims.dp = o.dp;
  dims.ep = o.ep;
  dims.tp = tp_degree(o, world);
  dims.data_parallel = o.data_parallel;
  dims.device = o.device;
  return dims;
}

llama::ParallelizeConfig parallelize_config(const TrainOptions& o) {
  return {.plan = o.plan,
          .tp = {.sequence_parallel = o.sequence_parallel, .loss_parallel = o.loss_parallel, .async_tp = o.async_tp},
          .gradient_sync = o.gradient_sync,
          .fsdp = {.reshard_after_forward = o.reshard_after_forward, .prefetch = o.fsdp_prefetch}};
}

void check_options(const TrainOptions& o, int64_t world) {
  const int64_t tp = tp_degree(o, world);
  if (o.dp * tp != world) {
    throw UsageError("--dp " + std::to_string(o.dp) + " x --tp " + std::to_string(tp) + " != world size " +
                     std::to_string(world) + " (run with --nproc-per-node " + std::to_string(o.dp * tp) + ")");
  }
  if (o.batch % o.dp != 0) {
    throw UsageError("--batch " + std::to_string(o.batch) + " is not divisible by --dp " + std::to_string(o.dp) +
                     " (each dp rank takes batch / dp sequences)");
  }
  if (o.sequence_parallel && o.seq_len % tp != 0) {
    throw UsageError("--seq-len " + std::to_string(o.seq_len) + " is not divisible by the TP degree " + std::to_string(tp) +
                     " (sequence parallel shards the sequence)");
  }
}

}  // namespace train
