// Llama under torchtitan's plan at TP 2 and 4 against the plain model (TP 1): the same loss curve (20
// steps, fp32, relative 1e-5) with sequence parallel and loss parallel on and off, the same gradient for
// every parameter after step 1, collectives per step equal to the plan's theory, and 1/TP of the sharded
// weights per rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <tuple>

#include "llama_test_util.h"

using llama_test::max_rel_diff;
using llama_test::run_tp;
using llama_test::small_options;

namespace {

// The plain model's run, with clipping (max_norm 1) or without (max_norm 0).
const llama_test::RunResult& tp1_reference(bool clip = true) {
  static const llama_test::RunResult with_clip = run_tp(small_options(), 1, /*capture_grads=*/true);
  static const llama_test::RunResult without_clip = [] {
    auto o = small_options();
    o.max_norm = 0;
    return run_tp(o, 1, /*capture_grads=*/true);
  }();
  return clip ? with_clip : without_clip;
}


struct Case {
  int tp;
  bool sequence_parallel;
  bool loss_parallel;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  return "tp" + std::to_string(info.param.tp) + (info.param.sequence_parallel ? "_sp" : "_nosp") +
         (info.param.loss_parallel ? "_lp" : "_nolp");
}

class LlamaParity : public testing::TestWithParam<Case> {};

TEST_P(LlamaParity, LossCurveAndStep1GradientsMatchTP1) {
  auto options = small_options();
  options.sequence_parallel = GetParam().sequence_parallel;
  options.loss_parallel = GetParam().loss_parallel;
  const auto& ref = tp1_reference();
  llama_test::RunResult run = run_tp(options, GetParam().tp, /*capture_grads=*/true);
  ASSERT_EQ(run.losses.size(), 20u);
  EXPECT_LE(max_rel_diff(ref.losses, run.losses), 1e-5) << "first loss " << run.losses.front() << " vs " << ref.losses.front();
  EXPECT_LT(run.losses.back(), run.losses.front());  // it learns
  ASSERT_EQ(run.step1_grads.size(), ref.step1_grads.size());
  for (const auto& [name, g] : ref.step1_grads) {
    ASSERT_TRUE(run.step1_grads.contains(name)) << name;
    EXPECT_TRUE(at::allclose(run.step1_grads.at(name), g, 1e-4, 1e-6))
        << name << ": max |diff| " << (run.step1_grads.at(name) - g).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, LlamaParity,
                         testing::Values(Case{2, true, true}, Case{2, true, false}, Case{2, false, true},
                                         Case{2, false, false}, Case{4, true, true}, Case{4, false, false}),
                         case_name);

// HF's base_model_tp_plan (strings, local outputs) gives the losses of the plain model.
TEST(LlamaPlans, HfStringPlanMatchesTP1) {
  auto options = small_options();
  options.plan = llama::TPPlan::hf;
  options.sequence_parallel = options.loss_parallel = false;
  llama_test::RunResult run = run_tp(options, 2, false);
  EXPECT_LE(max_rel_diff(tp1_reference().losses, run.losses), 1e-5);
}

// Without sequence parallel (and under HF's plan) some parameters are plain tensors and others DTensors;
// dtensor::clip_grad_norm_ counts the plain ones once.
TEST(LlamaPlans, ClippingOverPlainAndDTensorGradients) {
  auto options = small_options();
  options.sequence_parallel = false;
  llama_test::RunResult run = run_tp(options, 2, false);
  EXPECT_LE(max_rel_diff(tp1_reference().losses, run.losses), 1e-5);
}

// Per layer forward with sequence parallel: 2 all-gathers (attention and feed-forward inputs, Shard(1) ->
// Replicate) and 2 reduce-scatters (o_proj and down_proj, Partial -> Shard(1)) of b·s·h. Around the layers:
// the embedding's reduce-scatter, lm_head's all-gather. Backward runs the conjugates (all-gather <->
// reduce-scatter); the SequenceParallel norm weights' gradients, Partial over the sequence shards, are
// reduced together by one bucketed all-reduce (gradient_sync.h). Clipping and AdamW then add only the
// total norm's all-reduce: the whole step is 2(2L+1) all-gathers, 2(2L+1) reduce-scatters, the
// loss-parallel all-reduces and 2 all-reduces (PyTorch: one all-reduce per Partial gradient per optimizer op).
class LlamaCollectives : public testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(LlamaCollectives, WholeStepCountsMatchThePlan) {
  const auto [tp, loss_parallel] = GetParam();
  auto options = small_options();
  options.loss_parallel = loss_parallel;  // off: logits gathered, lm_head output Replicate (one more all-gather)
  options.steps = 2;
  options.model.num_key_value_heads = 4;  // plain Colwise k/v at TP 2 and 4 (fewer heads than TP: all-to-alls)
  const auto run = run_tp(options, tp);
  const auto& step = run.steps.back();
  const int64_t L = options.model.num_hidden_layers;
  const int64_t b = options.batch, s = options.seq_len, h = options.model.hidden_size, v = options.model.vocab_size;
  auto get = [](const std::map<std::string, int64_t>& m, const char* c) { return m.contains(c) ? m.at(c) : 0; };
  auto count = [&](const char* c) { return get(step.fwd_bwd_counts, c); };
  auto bytes = [&](const char* c) { return get(step.fwd_bwd_bytes, c); };
  for (const auto& [c, n] : step.fwd_bwd_counts) std::printf("  fwd+bwd %s: %lld (%lld bytes)\n", c.c_str(), (long long)n, (long long)bytes(c.c_str()));
  for (const auto& [c, n] : step.update_counts) std::printf("  update  %s: %lld (%lld bytes)\n", c.c_str(), (long long)n, (long long)step.update_bytes.at(c));
  const int64_t act = b * s * h * 4 / tp;  // one rank's b·s·h/tp fp32 shard: the input of an all-gather
  // forward: 2L + 1 (lm_head input) [+ 1: lm_head's logits to Replicate]; backward: 2L + 1 (embedding).
  const int64_t gathers = 2 * (2 * L + 1) + (loss_parallel ? 0 : 1);
  EXPECT_EQ(count("all_gather"), gathers);
  EXPECT_EQ(bytes("all_gather"), 2 * (2 * L + 1) * act + (loss_parallel ? 0 : b * s * v * 4 / tp));
  // forward: 2L + 1 (embedding); backward: 2L + 1 (lm_head input). A reduce-scatter's input is the full b·s·h.
  EXPECT_EQ(count("reduce_scatter"), 2 * (2 * L + 1));
  EXPECT_EQ(bytes("reduce_scatter"), 2 * (2 * L + 1) * tp * act);
  // Loss parallel: 3 all-reduces (max, sum of exps, target logit). Then one bucket of norm gradients:
  // (2L + 1) weights of h floats.
  const int64_t loss_reduces = loss_parallel ? 3 : 0;
  EXPECT_EQ(count("all_reduce"), loss_reduces + 1);
  EXPECT_EQ(get(step.update_counts, "all_reduce"), 1);  // the total norm
  EXPECT_EQ(step.update_counts.size(), 1u);
  EXPECT_EQ(step.total_counts(), gathers + 2 * (2 * L + 1) + loss_reduces + 2);
}

INSTANTIATE_TEST_SUITE_P(TP, LlamaCollectives,
                         testing::Combine(testing::Values(2, 4), testing::Bool()),
                         [](const testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return "tp" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_lp" : "_nolp");
                         });

// Gradients reduced once give the numbers of PyTorch's behaviour (Partial norm gradients reduced by every
// op that reads them): the loss curves agree to 1e-6, at TP 2 and 4.
TEST(LlamaGradientSync, SameLossesAsPartialGradients) {
  for (int tp : {2, 4}) {
    auto options = small_options();
    options.model.num_key_value_heads = 4;
    options.steps = 10;
    const auto on = run_tp(options, tp);
    options.gradient_sync = false;
    const auto off = run_tp(options, tp);
    EXPECT_LE(max_rel_diff(on.losses, off.losses), 1e-6) << "tp " << tp;
    EXPECT_LT(on.steps.back().total_counts(), off.steps.back().total_counts());
  }
}

// 1/TP of every sharded weight plus the replicated norms.
TEST(LlamaParams, BytesPerRankAreOneOverTPOfShardedWeights) {
  auto options = small_options();
  const auto& c = options.model;
  const int64_t h = c.hidden_size, kv = c.num_key_value_heads * c.head_dim(), f = c.intermediate_size, L = c.num_hidden_layers;
  const int64_t sharded = 2 * c.vocab_size * h + L * (2 * h * h + 2 * h * kv + 3 * h * f);
  const int64_t norms = (2 * L + 1) * h;
  const auto run = run_tp(options, 2);
  EXPECT_EQ(run.param_bytes_per_rank, static_cast<int64_t>(sizeof(float)) * (sharded / 2 + norms));
}

}  // namespace
