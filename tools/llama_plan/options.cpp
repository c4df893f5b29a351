#include "options.h"

#include "llama/hf_config.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "dtensor/core/error.h"

namespace llama_plan {
namespace {

using tools_cli::parse_number;
using tools_cli::positive;
using tools_cli::UsageError;

// Meta Llama 3's published shapes (HF config.json of Meta-Llama-3-8B / -70B).
llama::LlamaConfig preset(const std::string& name) {
  llama::LlamaConfig c;
  c.vocab_size = 128256;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 8192;
  c.rope_theta = 500000.0;
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
  while (std::getline(in, item, ',')) ranks.push_back(static_cast<int>(parse_number<int64_t>("ranks", item)));
  if (ranks.empty()) throw UsageError("--ranks: give 'all' or a comma-separated list");
  return ranks;
}

}  // namespace

std::string help_text() {
  std::ostringstream os;
  const PlanOptions d;
  os << "llama_plan: what one training step of Llama under torchtitan's TP plan does on each rank, from a dry run\n"
     << "of the real model code on meta tensors (no memory, no peers), with an estimated step time.\n\n"
     << "  --preset llama3-8b|llama3-70b   Meta Llama 3 shapes (size flags after it override)\n"
     << "  --hf-config FILE          sizes from an HF config.json\n"
     << "  --dim N --layers N --heads N --kv-heads N --ffn-dim N --vocab N   model sizes (default: the small model)\n"
     << "  --seq-len N               tokens per sequence (default " << d.seq_len << ")\n"
     << "  --batch N                 sequences per step, global (default " << d.batch << ")\n"
     << "  --tp N                    tensor-parallel degree (default " << d.tp << ")\n"
     << "  --dp N                    data-parallel degree: mesh dp x tp (default " << d.dp << ")\n"
     << "  --ep N                    expert parallelism over N of the dp ranks (a mixture of experts; mesh dp/N x N x tp)\n"
     << "  --ddp / --fsdp            data parallel over dp: replicate (default) or fully_shard, as llama_train\n"
     << "  --sequence-parallel / --no-sequence-parallel   (default on)\n"
     << "  --loss-parallel / --no-loss-parallel           (default on)\n"
     << "  --async-tp                SP's all-gathers and reduce-scatters fused with their matmuls (needs SP)\n"
     << "  --plan torchtitan|hf      the TP pairs: torchtitan's plan (default) or HF's tp_plan\n"
     << "  --no-optimizer            no AdamW step\n"
     << "  --search                  search the plan: every composition of the TP pairs, SP, loss parallel, async TP\n"
     << "                            and FSDP / DDP, dry-run and costed; prints the fastest that fits (with --json:\n"
     << "                            plan, predicted_step_ms, predicted_peak_bytes_per_rank, why, candidates)\n"
     << "  --memory-budget-mb M      with --search: the per-rank peak memory the plan must fit\n"
     << "  --ranks all|R,R,...       ranks to simulate (default: 0 and the last)\n"
     << "  --comm-table FILE         collective latency/bandwidth from comm_bench's output (default: built in)\n"
     << "  --mm-gflops X             local matmul throughput (default: measured, ~0.1 s)\n"
     << "  --memory-gbps X           memory bandwidth for the step's elementwise rest (default: measured)\n"
     << "  --dtensor-op-us X         microseconds each DTensor operator call adds (default: measured)\n"
     << "  --json                    one JSON object instead of the tables\n";
  return os.str();
}

CliOptions parse_options(const std::vector<std::string>& args) {
  CliOptions o;
  llama::LlamaConfig& m = o.plan.model;
  // The model's base first (--preset, --hf-config), wherever they appear: the size flags refine it.
  for (size_t i = 0; i < args.size(); ++i) {
    auto value_of = [&](const std::string& flag) -> std::optional<std::string> {
      if (args[i] == "--" + flag) {
        if (i + 1 >= args.size()) throw UsageError("--" + flag + " needs a value");
        return args[i + 1];
      }
      if (args[i].rfind("--" + flag + "=", 0) == 0) return args[i].substr(flag.size() + 3);
      return std::nullopt;
    };
    if (auto v = value_of("preset")) m = preset(*v);
    if (auto v = value_of("hf-config")) {
      try {
        m = llama::config_from_hf_json(*v);
      } catch (const std::exception& e) {
        throw UsageError(std::string("--hf-config: ") + e.what());
      }
    }
  }
  tools_cli::parse_args(
      args,
      {
          {"preset", [](const std::string&) {}},
          {"hf-config", [](const std::string&) {}},
          {"dim", [&](const std::string& v) { m.hidden_size = positive("dim", v); }},
          {"layers", [&](const std::string& v) { m.num_hidden_layers = positive("layers", v); }},
          {"heads", [&](const std::string& v) { m.num_attention_heads = positive("heads", v); }},
          {"kv-heads", [&](const std::string& v) { m.num_key_value_heads = positive("kv-heads", v); }},
          {"ffn-dim", [&](const std::string& v) { m.intermediate_size = positive("ffn-dim", v); }},
          {"vocab", [&](const std::string& v) { m.vocab_size = positive("vocab", v); }},
          {"seq-len", [&](const std::string& v) { o.plan.seq_len = positive("seq-len", v); }},
          {"batch", [&](const std::string& v) { o.plan.batch = positive("batch", v); }},
          {"tp", [&](const std::string& v) { o.plan.tp = positive("tp", v); }},
          {"dp", [&](const std::string& v) { o.plan.dp = positive("dp", v); }},
          {"ep", [&](const std::string& v) { o.plan.ep = positive("ep", v); }},
          {"ranks", [&](const std::string& v) { o.plan.ranks = parse_ranks(v); }},
          {"comm-table", [&](const std::string& v) { o.comm_table = v; }},
          {"plan", [&](const std::string& v) {
             if (v != "torchtitan" && v != "hf") throw UsageError("--plan must be torchtitan or hf, got '" + v + "'");
             o.plan.tp_plan = llama::tp_plan_from_string(v);
           }},
          {"memory-budget-mb", [&](const std::string& v) { o.memory_budget_mb = positive("memory-budget-mb", v); }},
          {"memory-gbps",
           [&](const std::string& v) {
             o.memory_gbps = parse_number<double>("memory-gbps", v);
             if (o.memory_gbps <= 0) throw UsageError("--memory-gbps must be positive, got " + v);
           }},
          {"dtensor-op-us",
           [&](const std::string& v) {
             o.dtensor_op_us = parse_number<double>("dtensor-op-us", v);
             if (o.dtensor_op_us < 0) throw UsageError("--dtensor-op-us must be >= 0, got " + v);
           }},
          {"mm-gflops",
           [&](const std::string& v) {
             o.mm_gflops = parse_number<double>("mm-gflops", v);
             if (o.mm_gflops <= 0) throw UsageError("--mm-gflops must be positive, got " + v);
           }},
      },
      {
          {"sequence-parallel", [&] { o.plan.sequence_parallel = true; }},
          {"no-sequence-parallel", [&] { o.plan.sequence_parallel = false; }},
          {"loss-parallel", [&] { o.plan.loss_parallel = true; }},
          {"no-loss-parallel", [&] { o.plan.loss_parallel = false; }},
          {"async-tp", [&] { o.plan.async_tp = true; }},
          {"no-optimizer", [&] { o.plan.optimizer = false; }},
          {"ddp", [&] { o.plan.data_parallel = models::DataParallel::ddp; }},
          {"fsdp", [&] { o.plan.data_parallel = models::DataParallel::fsdp; }},
          {"json", [&] { o.json = true; }},
          {"search", [&] { o.search = true; }},
          {"help", [&] { o.help = true; }},
      });
  if (o.memory_budget_mb > 0 && !o.search) throw UsageError("--memory-budget-mb needs --search");
  if (o.plan.async_tp && !o.plan.sequence_parallel) {
    throw UsageError("--async-tp needs sequence parallel (drop --no-sequence-parallel)");
  }
  m.max_position_embeddings = std::max(m.max_position_embeddings, o.plan.seq_len);
  if (o.plan.ranks.size() == 1 && o.plan.ranks[0] == -1) {
    o.plan.ranks.resize(o.plan.tp * o.plan.dp);
    for (size_t r = 0; r < o.plan.ranks.size(); ++r) o.plan.ranks[r] = static_cast<int>(r);
  }
  for (int r : o.plan.ranks) {
    if (r < 0 || r >= o.plan.tp * o.plan.dp) {
      throw UsageError("--ranks: rank " + std::to_string(r) + " is outside the mesh of " +
                       std::to_string(o.plan.tp * o.plan.dp) + " ranks");
    }
  }
  try {
    m.validate();
  } catch (const dtensor::Error& e) {
    throw UsageError(e.what());
  }
  return o;
}

}  // namespace llama_plan
