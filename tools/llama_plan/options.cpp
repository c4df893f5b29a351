#include "options.h"

#include "llama/hf_config.h"

#include <algorithm>
#include <sstream>
#include <tuple>
#include <utility>

#include "dtensor/core/error.h"
#include "tools/common/lora_flags.h"
#include "tools/common/parallelism_flags.h"

namespace llama_plan {
namespace {

using tools_cli::UsageError;

// Meta Llama 3's published shapes (HF config.json of Meta-Llama-3-8B / -70B).
llama::LlamaConfig preset(const std::string& name) {
  llama::LlamaConfig c;
  c.vocab_size = 128256;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 8192;
  c.rotary.rope_theta = 500000.0;
  if (name == "llama3-8b") {
    c.hidden_size = 4096, c.num_hidden_layers = 32, c.num_attention_heads = 32, c.intermediate_size = 14336;
  } else if (name == "llama3-70b") {
    c.hidden_size = 8192, c.num_hidden_layers = 80, c.num_attention_heads = 64, c.intermediate_size = 28672;
  } else {
    throw UsageError("--preset: '" + name + "' is not a preset (llama3-8b, llama3-70b)");
  }
  return c;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  if (text == "all") return {-1};  // expanded once the mesh size is known
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) ranks.push_back(tools_cli::parse_number<int>("--ranks", item));
  if (ranks.empty()) throw UsageError("--ranks: give 'all' or a comma-separated list");
  return ranks;
}

// The model's base (--preset, --hf-config) and the size flags that refine it, wherever they appear.
struct ModelFlags {
  std::string preset, hf_config;
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0, ffn_dim = 0, vocab = 0;  // 0: the base's
};

// The options, defined once: parse_options reads them, help_text prints them.
void define(CLI::App& app, CliOptions& o, ModelFlags& m, tools_cli::ParallelismSeen& parallelism) {
  tools_cli::configure(app, "llama_plan");
  app.description(
      "llama_plan: what one training step of Llama under torchtitan's TP plan does on each rank, from a dry run\n"
      "of the real model code on meta tensors (no memory, no peers), with an estimated step time.");
  const std::string model = "model (default: the small model)";
  app.add_option("--preset", m.preset, "Meta Llama 3 shapes (size flags override)")
      ->check(CLI::IsMember({"llama3-8b", "llama3-70b"}))->group(model);
  app.add_option("--hf-config", m.hf_config, "sizes from an HF config.json")->option_text("FILE")->group(model);
  for (auto [name, field, help] : {std::tuple{"--dim", &m.dim, "hidden size"}, {"--layers", &m.layers, "decoder layers"},
                                   {"--heads", &m.heads, "query heads"}, {"--kv-heads", &m.kv_heads, "key/value heads"},
                                   {"--ffn-dim", &m.ffn_dim, "SwiGLU hidden size"}, {"--vocab", &m.vocab, "vocabulary"}}) {
    app.add_option(name, *field, help)->check(tools_cli::positive())->default_str("")->group(model);
  }
  tools_cli::add_parallelism_flags(app, o.plan, parallelism);  // llama_train's, declared once
  tools_cli::add_lora_flags(app, o.plan);                       // the adapters counted as a LoRA run has them
  app.add_flag_callback("--no-optimizer", [&] { o.plan.optimizer = false; }, "no AdamW step");
  app.add_flag_callback("--search", [&] { o.plan.plan_auto = true; },
                        "search the plan (as --plan auto): every composition of the TP pairs, SP, loss parallel, async "
                        "TP and FSDP / DDP, dry-run and costed; prints the fastest that fits (with --json: plan, "
                        "predicted_step_ms, predicted_peak_bytes_per_rank, why, candidates)");
  app.add_option_function<std::string>("--ranks", [&](const std::string& v) { o.plan.ranks = parse_ranks(v); },
                                       "ranks to simulate (default: 0 and the last)")
      ->option_text("all|R,R,...");
  app.add_option("--comm-table", o.comm_table, "collective latency/bandwidth from comm_bench's output (default: built in)");
  app.add_option("--machine", o.machine,
                 "the machine the step is priced for: stated (the development machine's numbers, fixed: the same "
                 "answer every run) or measured (this machine's, each the median of 5 timings with its range, cached "
                 "per CPU model and thread count under $XDG_CACHE_HOME/dtensor/machine)")
      ->check(CLI::IsMember({"stated", "measured"}));
  app.add_flag("--remeasure", o.remeasure, "with --machine measured: time this machine again, replacing the cache");
  app.add_option("--mm-gflops", o.mm_gflops, "local matmul throughput (default: the --machine's)")
      ->check(tools_cli::positive())->default_str("");
  app.add_option("--memory-gbps", o.memory_gbps, "memory bandwidth for the step's elementwise rest (default: the --machine's)")
      ->check(tools_cli::positive())->default_str("");
  app.add_option("--dtensor-op-us", o.dtensor_op_us, "microseconds each DTensor operator call adds (default: the --machine's)")
      ->check(tools_cli::non_negative())->default_str("");
  app.add_flag("--json", o.json, "one JSON object instead of the tables");
}

}  // namespace

std::string help_text() {
  CliOptions d;
  ModelFlags m;
  tools_cli::ParallelismSeen parallelism;
  CLI::App app;
  define(app, d, m, parallelism);
  return app.help();
}

CliOptions parse_options(const std::vector<std::string>& args) {
  CliOptions o;
  ModelFlags flags;
  tools_cli::ParallelismSeen parallelism;
  CLI::App app;
  define(app, o, flags, parallelism);
  o.help = tools_cli::parse(app, args);
  if (o.help) return o;
  llama::LlamaConfig& m = o.plan.model;
  if (!flags.preset.empty()) m = preset(flags.preset);
  if (!flags.hf_config.empty()) {
    try {
      m = llama::config_from_hf_json(flags.hf_config);
    } catch (const std::exception& e) {
      throw UsageError(std::string("--hf-config: ") + e.what());
    }
  }
  for (auto [given, field] : {std::pair{flags.dim, &m.hidden_size}, {flags.layers, &m.num_hidden_layers},
                              {flags.heads, &m.num_attention_heads}, {flags.kv_heads, &m.num_key_value_heads},
                              {flags.ffn_dim, &m.intermediate_size}, {flags.vocab, &m.vocab_size}}) {
    if (given > 0) *field = given;
  }
  if (o.remeasure && o.machine != "measured") throw UsageError("--remeasure needs --machine measured");
  tools_cli::resolve_parallelism_flags(o.plan, parallelism);
  m.max_position_embeddings = std::max(m.max_position_embeddings, o.plan.seq_len);
  try {
    train::resolve_options(o.plan);  // llama_train's checks of the job, and its messages
  } catch (const train::ConfigError& e) {
    throw UsageError(e.what());
  }
  const int64_t world = o.plan.dp * o.plan.cp * o.plan.tp;
  if (o.plan.ranks.size() == 1 && o.plan.ranks[0] == -1) {
    o.plan.ranks.resize(world);
    for (size_t r = 0; r < o.plan.ranks.size(); ++r) o.plan.ranks[r] = static_cast<int>(r);
  }
  for (int r : o.plan.ranks) {
    if (r < 0 || r >= world) {
      throw UsageError("--ranks: rank " + std::to_string(r) + " is outside the mesh of " + std::to_string(world) + " ranks");
    }
  }
  return o;
}

}  // namespace llama_plan
