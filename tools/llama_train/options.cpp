#include "tools/llama_train/options.h"
#include "tools/common/dtype_option.h"

#include <filesystem>

namespace llama_train {
namespace {

// What parsing saw beyond the fields: the last model-size flag (--hf-dir brings its own sizes) and whether --dp
// was given (--ep sets dp to ep when it was not).
struct Seen {
  std::string size_flag;
  bool dp = false;
};

// The options, defined once: parse_options reads them, help_text prints them.
void define(CLI::App& app, train::TrainOptions& o, Seen& seen) {
  tools_cli::configure(app, "llama_train");
  app.description(
      "llama_train: trains a Llama-3-style model under tensor parallelism (torchtitan's TP + SP plan).\n"
      "  tprun --nproc-per-node 2 llama_train [options]");
  app.add_option("--tp", o.tp, "TP degree (default: the world size / dp)")->check(tools_cli::positive());
  app.add_option_function<int64_t>("--dp", [&](const int64_t& v) { o.dp = v, seen.dp = true; },
                                   "data-parallel degree on a (dp, tp) mesh, world = dp * tp; each dp rank trains on "
                                   "its batch / dp sequences of the global batch")
      ->check(tools_cli::positive())->default_str("1");
  app.add_option("--ep", o.ep,
                 "expert parallelism (a mixture of experts): the experts split over N of the dp ranks, tokens sent to "
                 "them by all_to_all (--dp defaults to N; DDP only)")
      ->check(tools_cli::positive());
  app.add_option("--cp", o.cp,
                 "context parallelism: each sequence split over N ranks (load-balanced chunks), attention as ring "
                 "attention; world = dp x cp x tp, and DDP / FSDP reduce over dp x cp")
      ->check(tools_cli::positive());
  app.add_option("--cp-rotate-method", o.cp_rotate_method,
                 "how ring attention's keys and values travel: allgather (one all-gather) or alltoall (a ring of "
                 "rotations, each overlapped with a block)")
      ->check(CLI::IsMember({"allgather", "alltoall"}));
  app.add_flag_callback("--ddp", [&] { o.data_parallel = models::DataParallel::ddp; },
                        "the data-parallel kind: replicate (DDP, default)");
  app.add_flag_callback("--fsdp", [&] { o.data_parallel = models::DataParallel::fsdp; },
                        "the data-parallel kind: fully_shard (FSDP2)");
  app.add_flag("--reshard-after-forward,!--no-reshard-after-forward", o.reshard_after_forward,
               "fsdp: free each block's gathered parameters after its forward (default on)");
  app.add_flag("--fsdp-prefetch,!--no-fsdp-prefetch", o.fsdp_prefetch,
               "fsdp: the next block's all-gather runs while this one computes (default on)");
  app.add_option("--hf-dir", o.hf_dir,
                 "fine-tune a Hugging Face checkpoint: its config.json is the model (no size flags then), its weights "
                 "the start");
  tools_cli::add_dtype(app, o.dtype);
  app.add_option_function<std::string>(
         "--mixed-precision", [&](const std::string& v) { o.mixed_precision = train::mixed_precision_from_string(v); },
         "compute in bf16 with float32 master weights, optimizer state and gradient reductions, as torchtitan "
         "(default); off: compute in --dtype; fp16 is refused (it needs loss scaling)")
      ->check(CLI::IsMember({"bf16", "fp16", "off"}))->default_str(train::to_string(o.mixed_precision));
  CLI::Option* float8 = app.add_flag("--float8", o.float8,
               "the decoder's Linear layers (not lm_head) compute through float8 matmuls with dynamic scales "
               "(torchao's Float8Linear; dims divisible by 16)");
  app.add_option_function<std::string>(
         "--float8-recipe", [&](const std::string& v) { o.float8_recipe = dtensor::float8_recipe_from_string(v); },
         "with --float8: tensorwise (one scale per tensor, e5m2 gradients; default) or rowwise (a scale per row)")
      ->check(CLI::IsMember({"tensorwise", "rowwise"}))->default_str("tensorwise")->needs(float8);
  app.add_option("--tokenizer", o.tokenizer_dir,
                 "tokenize text --data with this HF tokenizer (default: --hf-dir's tokenizer.json, else bytes are "
                 "tokens); tokenized once into a cache, with a progress bar")
      ->check(CLI::Validator(
          [](std::string& v) {
            return std::filesystem::exists(std::filesystem::path(v) / "tokenizer.json")
                       ? std::string()
                       : "no tokenizer.json in '" + v + "'";
          },
          "DIR"));
  auto size = [&](const char* name, int64_t& field, const char* help) {
    app.add_option_function<int64_t>(name, [&field, &seen, name](const int64_t& v) { field = v, seen.size_flag = name; }, help)
        ->check(tools_cli::positive())->default_str(std::to_string(field));
  };
  size("--dim", o.model.hidden_size, "hidden size");
  size("--layers", o.model.num_hidden_layers, "decoder layers");
  size("--heads", o.model.num_attention_heads, "query heads");
  size("--kv-heads", o.model.num_key_value_heads, "key/value heads");
  size("--ffn-dim", o.model.intermediate_size, "SwiGLU hidden size");
  app.add_option("--seq-len", o.seq_len, "tokens per sequence")->check(tools_cli::positive());
  app.add_option("--batch", o.batch, "sequences per step")->check(tools_cli::positive());
  app.add_option("--steps", o.steps, "optimizer steps")->check(tools_cli::positive());
  app.add_option("--lr", o.lr, "peak AdamW learning rate")->check(tools_cli::positive());
  app.add_option("--warmup", o.warmup, "linear warmup steps, then cosine decay to 10%")->check(tools_cli::non_negative());
  app.add_option("--max-norm", o.max_norm, "gradient clipping norm, 0 = off")->check(tools_cli::non_negative());
  app.add_option("--seed", o.seed, "weights and batches");
  app.add_flag("--sequence-parallel,!--no-sequence-parallel", o.sequence_parallel, "sequence parallel (default on)");
  app.add_flag("--loss-parallel,!--no-loss-parallel", o.loss_parallel, "loss parallel (default on)");
  app.add_flag("--async-tp,!--no-async-tp", o.async_tp,
               "SP's all-gathers and reduce-scatters fused with their matmuls, pipelined (async TP; needs sequence "
               "parallel; default off)");
  app.add_flag("--gradient-sync,!--no-gradient-sync", o.gradient_sync,
               "reduce gradients once after backward (default on)");
  tools_cli::add_device(app, o.device);
  app.add_option_function<std::string>(
         "--plan",
         [&](const std::string& v) {
           o.plan_auto = v == "auto";
           if (!o.plan_auto) o.plan = llama::tp_plan_from_string(v);
         },
         "the TP plan (hf: no sequence or loss parallel; auto: searched (llama_plan --search), which also sets SP, "
         "loss parallel, async TP and FSDP / DDP, overriding their flags)")
      ->check(CLI::IsMember({"torchtitan", "hf", "auto"}))->default_str(llama::to_string(o.plan));
  app.add_option("--memory-budget-mb", o.memory_budget_mb, "with --plan auto: the per-rank peak memory the plan must fit")
      ->check(tools_cli::positive());
  app.add_option("--data", o.data,
                 "text file (bytes are tokens) or nanoGPT .bin of uint16 ids (default: the texts in "
                 "/usr/share/common-licenses)")
      ->check(CLI::ExistingFile);
  app.add_option("--log-every", o.log_every, "progress line every N steps")->check(tools_cli::positive());
  app.add_flag("--comm-detail", o.comm_detail, "a `comm` line per logged step: collectives by type, count and bytes");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "checkpoints go to DIR/step-NNNNNNNN (any TP degree can resume them; llama_generate --checkpoint DIR "
                 "speaks from the newest)")
      ->check(tools_cli::non_empty());
  app.add_option("--checkpoint-every", o.checkpoint_every, "save after every N steps and after the last step")
      ->check(tools_cli::positive());
  app.add_flag("--resume", o.resume, "continue from the newest checkpoint in --checkpoint-dir (none: start fresh)");
  app.add_option("--save-hf", o.save_hf,
                 "after the last step, save the model to DIR as transformers' save_pretrained does (config.json, "
                 "model.safetensors in the parameters' dtype, the tokenizer): AutoModelForCausalLM.from_pretrained(DIR) "
                 "loads it, serve --hf-dir DIR serves it")
      ->check(tools_cli::non_empty());
  app.add_option("--stop-after", o.stop_after,
                 "stop after step K, as an interrupted run (the schedule still spans --steps)")
      ->check(tools_cli::positive());
}

}  // namespace

std::string help_text() {
  train::TrainOptions d;
  Seen seen;
  CLI::App app;
  define(app, d, seen);
  return app.help();
}

train::TrainOptions parse_options(const std::vector<std::string>& args, bool& help) {
  train::TrainOptions o;
  Seen seen;
  CLI::App app;
  define(app, o, seen);
  help = tools_cli::parse(app, args);
  if (help) return o;
  if (!o.hf_dir.empty() && !seen.size_flag.empty()) {
    throw UsageError(seen.size_flag + " with --hf-dir: the checkpoint's config.json gives the model's sizes");
  }
  if (o.ep > 1 && !seen.dp) o.dp = o.ep;  // --dp defaults to --ep
  try {
    train::resolve_options(o);
  } catch (const train::ConfigError& e) {
    throw UsageError(e.what());
  }
  return o;
}

}  // namespace llama_train
