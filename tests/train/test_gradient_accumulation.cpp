// Gradient accumulation and evaluation in the training loop (train/step.h, train/eval.h), fp32:
//   - a step of global_batch rows run as micro-batches equals one batch of them all: the step-1 gradients (1e-6) and
//     the 20-step loss curve, at TP 1 and 2, DDP and FSDP over dp 2 (with and without TP);
//   - gradients are reduced once per step, not per micro-batch: TP's gradient bucket, DDP's buckets and FSDP's
//     reduce-scatters are counted;
//   - the held-out split's windows, and its loss the same at every layout (transformers' loss over the same windows:
//     tests/train/accumulate_eval_test.py).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <string>

#include "models/llama_test_util.h"
#include "train/data.h"
#include "train/loop.h"

using llama_test::max_rel_diff;
using llama_test::run_dp_tp;
using llama_test::run_tp;
using llama_test::small_options;

namespace {

int64_t get(const std::map<std::string, int64_t>& m, const char* c) { return m.contains(c) ? m.at(c) : 0; }

const llama_test::RunResult& one_batch() {  // 4 rows per step, no accumulation, TP 1
  static const llama_test::RunResult ref = run_tp(small_options(), 1, /*capture_grads=*/true);
  return ref;
}

void expect_equal_to_one_batch(const llama_test::RunResult& run, const std::string& what) {
  const auto& ref = one_batch();
  ASSERT_EQ(run.losses.size(), ref.losses.size()) << what;
  EXPECT_LE(max_rel_diff(ref.losses, run.losses), 1e-5) << what << ": first loss " << run.losses.front() << " vs "
                                                       << ref.losses.front();
  for (const auto& [name, g] : ref.step1_grads) {
    ASSERT_TRUE(run.step1_grads.contains(name)) << what << " " << name;
    const double diff = (run.step1_grads.at(name) - g).abs().max().item<double>();
    EXPECT_LE(diff, 1e-6) << what << " " << name << ": max |diff| " << diff;
  }
}

struct Layout {
  int dp, tp;
  std::string kind;
};

class GradientAccumulation : public testing::TestWithParam<Layout> {};

TEST_P(GradientAccumulation, MicroBatchesEqualOneBatchOfTheSameSize) {
  const Layout l = GetParam();
  auto options = small_options();
  options.batch = l.dp;            // micro-batches of one row per dp rank
  options.global_batch = 4;        // the reference's batch: 4 / dp micro-batches
  options.data_parallel = models::data_parallel_from_string(l.kind);
  const auto run = l.dp > 1 ? run_dp_tp(options, l.dp, l.tp, /*capture_grads=*/true)
                            : run_tp(options, l.tp, /*capture_grads=*/true);
  EXPECT_EQ(run.steps.front().microbatches, 4 / l.dp);
  expect_equal_to_one_batch(run, l.kind + " dp " + std::to_string(l.dp) + " tp " + std::to_string(l.tp));
}

INSTANTIATE_TEST_SUITE_P(Layouts, GradientAccumulation,
                         testing::Values(Layout{1, 1, "ddp"}, Layout{1, 2, "ddp"}, Layout{2, 1, "ddp"}, Layout{2, 2, "ddp"},
                                         Layout{2, 1, "fsdp"}, Layout{2, 2, "fsdp"}),
                         [](const testing::TestParamInfo<Layout>& i) {
                           return i.param.kind + "_dp" + std::to_string(i.param.dp) + "_tp" + std::to_string(i.param.tp);
                         });

// Gradients reduced once per step. TP 2: loss parallel's 3 all-reduces run per micro-batch, the norm weights'
// gradient bucket once (3n + 1, where a reduction per micro-batch would make 4n). DDP: its bucket once. FSDP: one
// reduce-scatter per block per step, the all-gathers per micro-batch.
TEST(GradientAccumulationCollectives, GradientsAreReducedOncePerStep) {
  auto options = small_options();
  options.steps = 2;
  options.warmup = 1;
  {
    auto acc = options;
    acc.batch = 1, acc.global_batch = 4;
    // Copies: a reference into run_tp's returned RunResult would dangle once the statement ends (that read of freed
    // memory once counted 0 all-reduces under ctest -j2).
    const auto c = run_tp(acc, 2).steps.back().fwd_bwd_counts;
    EXPECT_EQ(get(c, "all_reduce"), 3 * 4 + 1) << "tp 2";
    const auto one = run_tp(options, 2).steps.back().fwd_bwd_counts;
    EXPECT_EQ(get(one, "all_reduce"), 3 + 1) << "tp 2, one batch";
  }
  for (const char* kind : {"ddp", "fsdp"}) {
    auto base = options;
    base.data_parallel = models::data_parallel_from_string(kind);
    auto acc = base;
    acc.batch = 2, acc.global_batch = 4;  // 2 micro-batches
    const auto one = run_dp_tp(base, 2, 1).steps.back().fwd_bwd_counts;
    const auto two = run_dp_tp(acc, 2, 1).steps.back().fwd_bwd_counts;
    for (const auto& [c, n] : two) std::printf("  %s accumulated fwd+bwd %s: %lld (one batch: %lld)\n", kind, c.c_str(), (long long)n, (long long)get(one, c.c_str()));
    EXPECT_EQ(get(two, "all_reduce"), get(one, "all_reduce")) << kind;
    EXPECT_EQ(get(two, "reduce_scatter"), get(one, "reduce_scatter")) << kind;
    EXPECT_EQ(get(two, "all_gather"), 2 * get(one, "all_gather")) << kind;
    if (std::string(kind) == "fsdp") {
      EXPECT_GT(get(one, "reduce_scatter"), 0);
    } else {
      EXPECT_GT(get(one, "all_reduce"), 0);
    }
  }
}

// The held-out split's windows: consecutive, overlapping by one token, in whole batches.
TEST(Evaluation, WindowsCoverTheSplitInOrder) {
  const train::Corpus c{at::arange(100, at::kLong), "arange(100)"};
  const auto batches = train::eval_batches(c, 2, 8);  // (100 - 1) / 8 = 12 windows: 6 batches
  ASSERT_EQ(batches.size(), 6u);
  for (int64_t k = 0; k < 6; ++k) {
    for (int64_t r = 0; r < 2; ++r) {
      const int64_t w = k * 2 + r;
      EXPECT_TRUE(at::equal(batches[k].inputs[r], at::arange(w * 8, w * 8 + 8, at::kLong))) << w;
      EXPECT_TRUE(at::equal(batches[k].labels[r], at::arange(w * 8 + 1, w * 8 + 9, at::kLong))) << w;
    }
  }
  EXPECT_EQ(train::eval_batches(c, 2, 8, 4).size(), 4u);
  EXPECT_THROW(train::eval_batches(c, 16, 8), std::exception);  // 12 windows: no whole batch of 16
}

// The same held-out loss at every layout (the trained models agree to fp32 rounding), evaluated after steps 5, 10, 15
// and 20.
TEST(Evaluation, MeanLossOverTheSplitIsTheSameAtEveryLayout) {
  auto options = small_options();
  options.eval_data = DTENSOR_SOURCE_DIR "/docs/design/layout.md";
  options.eval_every = 5;
  options.eval_batches = 6;
  auto eval_losses = [](const llama_test::RunResult& r) {
    std::vector<double> out;
    for (const auto& s : r.steps) {
      if (!std::isnan(s.eval_loss)) out.push_back(s.eval_loss);
    }
    return out;
  };
  const auto plain = run_tp(options, 1);
  const auto ref = eval_losses(plain);
  ASSERT_EQ(ref.size(), 4u);
  EXPECT_EQ(plain.steps.back().eval_tokens, 6 * options.batch * options.seq_len);
  EXPECT_LE(max_rel_diff(ref, eval_losses(run_tp(options, 2))), 1e-5) << "tp 2";
  for (const char* kind : {"ddp", "fsdp"}) {
    auto o = options;
    o.data_parallel = models::data_parallel_from_string(kind);
    EXPECT_LE(max_rel_diff(ref, eval_losses(run_dp_tp(o, 2, 2))), 1e-5) << kind << " dp 2 tp 2";
  }
}

}  // namespace
