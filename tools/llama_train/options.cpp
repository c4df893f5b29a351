#include "tools/llama_train/options.h"
#include "tools/common/dtype_option.h"
#include "tools/common/lora_flags.h"
#include "tools/common/parallelism_flags.h"

#include <filesystem>

namespace llama_train {
namespace {

// What parsing saw beyond the fields: the last model-size flag (--hf-dir brings its own sizes), and the parallelism
// flags' (tools/common/parallelism_flags.h).
struct Seen {
  std::string size_flag;
  tools_cli::ParallelismSeen parallelism;
};

// The options, defined once: parse_options reads them, help_text prints them.
void define(CLI::App& app, train::TrainOptions& o, Seen& seen) {
  tools_cli::configure(app, "llama_train");
  app.description(
      "llama_train: trains a Llama-3-style model under tensor parallelism (torchtitan's TP + SP plan).\n"
      "  tprun --nproc-per-node 2 llama_train [options]");
  tools_cli::add_parallelism_flags(app, o, seen.parallelism);
  app.add_option("--hf-dir", o.hf_dir,
                 "fine-tune a Hugging Face checkpoint: its config.json is the model (no size flags then), its weights "
                 "the start");
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
  app.add_option("--steps", o.steps, "optimizer steps")->check(tools_cli::positive());
  app.add_option("--lr", o.lr, "peak AdamW learning rate")->check(tools_cli::positive());
  app.add_option("--warmup", o.warmup, "linear warmup steps, then cosine decay to 10%")->check(tools_cli::non_negative());
  app.add_option("--max-norm", o.max_norm, "gradient clipping norm, 0 = off")->check(tools_cli::non_negative());
  app.add_option("--seed", o.seed, "weights and batches");
  tools_cli::add_device(app, o.device);
  app.add_option("--data", o.data,
                 "text file (bytes are tokens) or nanoGPT .bin of uint16 ids (default: the texts in "
                 "/usr/share/common-licenses)")
      ->check(CLI::ExistingFile);
  app.add_option("--global-batch", o.global_batch,
                 "sequences per optimizer step (torchtitan's global batch size): global-batch / batch micro-batches of "
                 "--batch each, their gradients added up and reduced once per step (gradient accumulation; default "
                 "--batch)")
      ->check(tools_cli::positive());
  app.add_option("--eval-data", o.eval_data,
                 "a held-out split (the formats of --data, tokenized alike): its mean loss and perplexity after the "
                 "last step (and every --eval-every steps), over consecutive windows of --seq-len + 1 tokens")
      ->check(CLI::ExistingFile);
  app.add_option("--eval-every", o.eval_every, "with --eval-data: evaluate after every N steps too")
      ->check(tools_cli::positive());
  app.add_option("--eval-batches", o.eval_batches,
                 "with --eval-data: the first N batches of --batch windows (default: every whole batch of the split)")
      ->check(tools_cli::positive());
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
  tools_cli::add_lora_flags(app, o);  // shared with llama_plan, whose dry run counts the adapters
  app.add_flag("--merge-lora", o.merge_lora,
               "with LoRA and --save-hf: save the model with the adapters merged into its weights (PEFT's "
               "merge_and_unload), a plain HF checkpoint, instead of the adapter");
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
  tools_cli::resolve_parallelism_flags(o, seen.parallelism);
  try {
    train::resolve_options(o);
  } catch (const train::ConfigError& e) {
    throw UsageError(e.what());
  }
  return o;
}

}  // namespace llama_train
