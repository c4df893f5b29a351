// paged_decode_bench: a decode step of continuous batching on an HF checkpoint (real_size_checkpoint.py writes random
// ones of real shapes): B sequences each after C cached positions, one new token each, through the model's forward
// with the step in its context and the logits of every row, as serve's engine runs a step. The pool holds zeros (the
// attention's cost does not depend on the values). Both routes of the step's attention: from the pool (each sequence
// over its own blocks, inference/paged_attention.h) and the reference (every sequence's keys gathered, a
// block-diagonal mask: what a step cost before), ms per step and tokens/s; the reference is skipped ("-") where its
// scores would exceed --reference-limit elements per layer. Rank 0 prints a table and a `summary` line.
//
//   tprun --nproc-per-node TP paged_decode_bench --hf-dir D [--batch 1,8,16,64] [--context 128,1024] [--iters 3]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "common/forward_context.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/process_group.h"
#include "inference/paged_kv_cache.h"
#include "inference/weights.h"

namespace {

constexpr int64_t kBlock = 16;

}  // namespace

int main(int argc, char** argv) {
  std::string hf_dir, batches = "1,8,16,64", contexts = "128,1024";
  int iters = 3;
  double reference_limit = 4e8;
  CLI::App app;
  tools_cli::configure(app, "paged_decode_bench");
  app.add_option("--hf-dir", hf_dir, "HF checkpoint directory (config.json + safetensors)")->required();
  app.add_option("--batch", batches, "sequences per step (comma-separated)");
  app.add_option("--context", contexts, "cached positions per sequence (comma-separated)");
  app.add_option("--iters", iters, "timed steps per row")->check(tools_cli::positive());
  app.add_option("--reference-limit", reference_limit, "largest reference score count (T x K x heads) per layer timed");
  std::vector<int64_t> batch_sizes, context_lengths;
  try {
    if (tools_cli::parse(app, std::vector<std::string>(argv + 1, argv + argc))) {
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    batch_sizes = dtensor::bench::int_list(batches, "--batch");
    context_lengths = dtensor::bench::int_list(contexts, "--context");
  } catch (const tools_cli::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  auto world = dtensor::init_process_group();
  const auto mesh = dtensor::init_device_mesh("cpu", {world->size()}, {"tp"});
  inference::ModelSource source;
  source.hf_dir = hf_dir;
  const llama::LlamaConfig config = inference::model_config(source, world->size());
  llama::LlamaForCausalLM model = inference::load_model(source, config, mesh);
  at::NoGradGuard no_grad;
  const bool rank0 = world->rank() == 0;
  if (rank0) {
    std::printf("paged decode step, %s, %lld layers, heads %lld / kv heads %lld, TP %d, %d thread(s) per rank\n",
                hf_dir.c_str(), (long long)config.num_hidden_layers, (long long)config.num_attention_heads,
                (long long)config.num_key_value_heads, world->size(), at::get_num_threads());
    std::printf("| batch | context | from the pool ms/step | tokens/s | reference ms/step | reference / pool |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|\n");
  }
  double last_tokens_per_s = 0;
  for (int64_t B : batch_sizes) {
    for (int64_t C : context_lengths) {
      const int64_t blocks_per_seq = (C + 1 + kBlock - 1) / kBlock;
      auto cache = std::make_shared<inference::PagedKVCache>(config.num_hidden_layers, B * blocks_per_seq, kBlock);
      const auto layers = cache->layers();
      std::vector<inference::PagedChunk> chunks;
      for (int64_t i = 0; i < B; ++i) {
        inference::PagedChunk c{{static_cast<int64_t>(5 + i)}, C, {}, 1};
        for (int64_t j = 0; j < blocks_per_seq; ++j) c.block_table.push_back(j * B + i);  // interleaved
        chunks.push_back(c);
      }
      double ms[2] = {-1, -1};
      for (int route = 0; route < 2; ++route) {
        inference::PagedStep step = inference::pack_step(chunks, kBlock);
        step.attention_from_pool = route == 0;
        const double scores = static_cast<double>(B) * step.key_slots.numel() * config.num_attention_heads;
        if (route == 1 && scores > reference_limit) continue;
        auto run = [&] {
          const models::ForwardContext context{layers, &step};
          const models::ForwardContextGuard on(context);
          const at::Tensor hidden = model->model(step.tokens.view({1, -1}));
          return model->logits(hidden.index_select(1, step.logit_rows));
        };
        ms[route] = dtensor::bench::mean_ms(iters, [&] { run(); });  // the warm-up call allocates the pool
      }
      last_tokens_per_s = 1000.0 * B / ms[0];
      if (rank0) {
        char ref[32] = "-", ratio[32] = "-";
        if (ms[1] > 0) std::snprintf(ref, sizeof ref, "%.1f", ms[1]), std::snprintf(ratio, sizeof ratio, "%.2f", ms[1] / ms[0]);
        std::printf("| %lld | %lld | %.1f | %.1f | %s | %s |\n", (long long)B, (long long)C, ms[0], last_tokens_per_s, ref,
                    ratio);
        std::fflush(stdout);
      }
    }
  }
  if (rank0) std::printf("summary paged_decode_bench last_tokens_per_s=%.1f\n", last_tokens_per_s);
  return 0;
}
