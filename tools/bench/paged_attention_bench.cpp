// paged_attention_bench: one layer's attention in a decode step of continuous batching, at Llama-3.2-1B's heads (32
// query heads, 8 key/value heads, head_dim 64, bf16): B sequences each after C cached positions, one new token each,
// their blocks of 16 interleaved in the pool. inference::paged_attention (each sequence over its own blocks, in place)
// beside the reference route it replaces (the step's keys gathered side by side, a block-diagonal mask, SDPA: what a
// step cost before), ms per call; and the kernel's read rate of the live keys and values (GB/s), whose bound is the
// memory's. The reference is skipped ("-") where its scores would exceed --reference-limit elements. Asserts nothing.
//
//   OMP_NUM_THREADS=2 paged_attention_bench [--iters N] [--batch 1,8,16,64] [--context 128,1024,4096]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dtensor/nn/attention.h"
#include "inference/paged_attention.h"
#include "inference/paged_kv_cache.h"

namespace {

constexpr int64_t kBlock = 16;

}  // namespace

int main(int argc, char** argv) {
  std::string batches = "1,8,16,64", contexts = "128,1024,4096";
  int64_t heads = 32, kv_heads = 8, d = 64;
  double reference_limit = 2e9;
  bool contiguous = false;
  const int iters = dtensor::bench::parse_iters(argc, argv, 10, "paged_attention_bench", [&](CLI::App& app) {
    app.add_option("--batch", batches, "sequences per step (comma-separated)");
    app.add_option("--context", contexts, "cached positions per sequence (comma-separated)");
    app.add_option("--heads", heads, "query heads");
    app.add_option("--kv-heads", kv_heads, "key/value heads");
    app.add_option("--head-dim", d, "head dim");
    app.add_option("--reference-limit", reference_limit, "largest reference score count (T x K x heads) timed");
    app.add_flag("--contiguous", contiguous, "each sequence's blocks one after another (default: interleaved)");
  });
  std::vector<int64_t> batch_sizes, context_lengths;
  try {
    batch_sizes = dtensor::bench::int_list(batches, "--batch");
    context_lengths = dtensor::bench::int_list(contexts, "--context");
  } catch (const tools_cli::UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  at::NoGradGuard no_grad;
  std::printf("paged attention, one layer, heads %lld / kv heads %lld / head_dim %lld, bf16, blocks of %lld, %d "
              "thread(s), kernel route for 1 row: %s\n",
              (long long)heads, (long long)kv_heads, (long long)d, (long long)kBlock, at::get_num_threads(),
              inference::paged_attention_route(at::zeros({1, heads, 1, d}, at::kBFloat16),
                                               at::zeros({1, kv_heads, 1, d}, at::kBFloat16), 1));
  std::printf("| batch | context | K and V MB | paged ms | GB/s | reference ms | reference / paged |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int64_t B : batch_sizes) {
    for (int64_t C : context_lengths) {
      const int64_t blocks_per_seq = (C + 1 + kBlock - 1) / kBlock, blocks = B * blocks_per_seq;
      std::vector<inference::PagedChunk> chunks;
      for (int64_t i = 0; i < B; ++i) {
        inference::PagedChunk c{{1}, C, {}, 1};
        for (int64_t j = 0; j < blocks_per_seq; ++j) c.block_table.push_back(contiguous ? i * blocks_per_seq + j : j * B + i);
        chunks.push_back(c);
      }
      const inference::PagedStep step = inference::pack_step(chunks, kBlock);
      const at::Tensor q = at::randn({1, B, heads, d}).to(at::kBFloat16).transpose(1, 2);
      const at::Tensor pool_k = at::randn({1, kv_heads, blocks * kBlock, d}).to(at::kBFloat16);
      const at::Tensor pool_v = at::randn({1, kv_heads, blocks * kBlock, d}).to(at::kBFloat16);
      const double mb = 2.0 * B * (C + 1) * kv_heads * d * 2 / 1e6;
      const double paged = dtensor::bench::mean_ms(iters, [&] {
        inference::paged_attention(q, pool_k, pool_v, step, std::nullopt, {});
      });
      const int64_t K = step.key_slots.numel();
      std::string ref = "-", ratio = "-";
      if (static_cast<double>(B) * K * heads <= reference_limit) {
        const double r = dtensor::bench::mean_ms(std::max(1, iters / 4), [&] {
          const at::Tensor visible = (step.key_seq.view({1, K}) == step.query_seq.view({B, 1})) &
                                     dtensor::nn::causal_visible(step.positions.view({B, 1}), step.key_pos.view({1, K}), 0);
          const at::Tensor mask = dtensor::nn::additive_mask(visible, q.options()).view({1, 1, B, K});
          dtensor::nn::scaled_dot_product_attention(q, pool_k.index_select(2, step.key_slots),
                                                           pool_v.index_select(2, step.key_slots), mask, false,
                                                           std::nullopt);
        });
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.3f", r);
        ref = buf;
        std::snprintf(buf, sizeof buf, "%.1f", r / paged);
        ratio = buf;
      }
      std::printf("| %lld | %lld | %.1f | %.3f | %.1f | %s | %s |\n", (long long)B, (long long)C, mb, paged,
                  mb / paged, ref.c_str(), ratio.c_str());
      std::fflush(stdout);
    }
  }
  std::printf("summary paged_attention_bench done\n");
  return 0;
}
