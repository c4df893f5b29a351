// Llama with async TP (--async-tp: sequence parallel's all-gathers and reduce-scatters fused with their
// matmuls, dtensor/tp/enable_async_tp.h) against the synchronous path: the loss curve within 1e-6
// relative at TP 2 and 4 (at TP 4 the GQA key/value heads are replicated, so k/v read the gathered input
// unfused), the step-1 gradients, the collectives counted under the fused ops' names, and the errors.
#include <gtest/gtest.h>

#include <cstdio>

#include "dtensor/dtensor.h"
#include "harness/multi_rank.h"
#include "llama/parallelize.h"
#include "models/llama_test_util.h"

using llama_test::max_rel_diff;
using llama_test::run_tp;
using llama_test::small_options;

namespace {

int64_t get(const std::map<std::string, int64_t>& m, const char* c) { return m.contains(c) ? m.at(c) : 0; }

TEST(LlamaAsyncTP, LossCurveAndGradientsMatchTheSynchronousPath) {
  for (int tp : {2, 4}) {
    auto options = small_options();
    const llama_test::RunResult sync = run_tp(options, tp, /*capture_grads=*/true);
    options.async_tp = true;
    const llama_test::RunResult async = run_tp(options, tp, /*capture_grads=*/true);
    ASSERT_EQ(async.losses.size(), 20u);
    const double diff = max_rel_diff(sync.losses, async.losses);
    std::printf("  tp %d: max relative loss difference async vs sync %.3g (last loss %.7f vs %.7f)\n", tp, diff,
                async.losses.back(), sync.losses.back());
    EXPECT_LE(diff, 1e-6) << "tp " << tp;
    EXPECT_LT(async.losses.back(), async.losses.front());
    for (const auto& [name, g] : sync.step1_grads) {
      ASSERT_TRUE(async.step1_grads.contains(name)) << name;
      EXPECT_TRUE(at::allclose(async.step1_grads.at(name), g, 1e-5, 1e-7))
          << "tp " << tp << " " << name << ": max |diff| " << (async.step1_grads.at(name) - g).abs().max().item<double>();
    }
  }
}

// With every projection Shard(0)/Shard(1) (4 key/value heads), each SP boundary is fused: per layer, the
// attention and MLP inputs' all-gathers (with q/k/v and gate/up) and o_proj's and down_proj's
// reduce-scatters; lm_head's input all-gather too. Backward runs the conjugates, also fused. What stays
// plain: the embedding's reduce-scatter (a lookup, not a matmul) and its backward all-gather. Bytes per
// kind equal the synchronous step's.
TEST(LlamaAsyncTP, CollectivesAreCountedUnderTheFusedOpsNames) {
  for (int tp : {2, 4}) {
    auto options = small_options();
    options.steps = 2;
    options.model.num_key_value_heads = 4;
    const auto sync = run_tp(options, tp).steps.back();
    options.async_tp = true;
    const auto async = run_tp(options, tp).steps.back();
    const int64_t L = options.model.num_hidden_layers;
    const auto& n = async.fwd_bwd_counts;
    const auto& bytes = async.fwd_bwd_bytes;
    for (const auto& [c, k] : n) std::printf("  tp %d fwd+bwd %s: %lld (%lld bytes)\n", tp, c.c_str(), (long long)k, (long long)bytes.at(c));
    EXPECT_EQ(get(n, "fused_all_gather_matmul"), 2 * L + 1 + 2 * L);      // forward 2L + lm_head; backward o, down
    EXPECT_EQ(get(n, "fused_matmul_reduce_scatter"), 2 * L + 2 * L + 1);  // forward o, down; backward 2L + lm_head
    EXPECT_EQ(get(n, "all_gather"), 1);                                   // the embedding's backward
    EXPECT_EQ(get(n, "reduce_scatter"), 1);                               // the embedding's forward
    EXPECT_EQ(get(bytes, "all_gather") + get(bytes, "fused_all_gather_matmul"), get(sync.fwd_bwd_bytes, "all_gather"));
    EXPECT_EQ(get(bytes, "reduce_scatter") + get(bytes, "fused_matmul_reduce_scatter"),
              get(sync.fwd_bwd_bytes, "reduce_scatter"));
    EXPECT_EQ(get(n, "all_reduce"), get(sync.fwd_bwd_counts, "all_reduce"));  // loss parallel, gradient sync
    EXPECT_EQ(async.update_counts, sync.update_counts);
  }
}

TEST(LlamaAsyncTP, NeedsSequenceParallel) {
  auto options = small_options();
  options.async_tp = true;
  options.sequence_parallel = false;
  const std::string error = dtensor::testing::error_of([&] { run_tp(options, 2); });
  EXPECT_NE(error.find("needs sequence_parallel"), std::string::npos) << error;
  // The pass itself, on a plan with no SP boundary (HF's: all-reduces), names what it looked for.
  dtensor::testing::run_ranks(2, [](int, int world) {
    const auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model(small_options().model);
    const auto plan = llama::hf_plan(model->config, world);
    dtensor::parallelize_module(*model, mesh, plan);
    const std::string e = dtensor::testing::error_of([&] { dtensor::enable_async_tp(*model, mesh, plan); });
    EXPECT_NE(e.find("no sequence-parallel boundary"), std::string::npos) << e;
  });
  // The job's options (llama_train's flags: exit 2 before anything starts).
  train::TrainOptions no_sp;
  no_sp.async_tp = true, no_sp.sequence_parallel = false;
  train::TrainOptions hf;
  hf.async_tp = true, hf.plan = llama::TPPlan::hf;
  for (train::TrainOptions o : {no_sp, hf}) EXPECT_THROW(train::resolve_options(o), train::ConfigError);
}

}  // namespace
