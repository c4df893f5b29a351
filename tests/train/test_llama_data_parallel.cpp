// Llama on a 2-D ("dp", "tp") mesh: data parallel over dp (replicate = DDP, fully_shard = FSDP2) and
// torchtitan's TP over tp. The same global batch as the plain model (each dp rank takes batch / dp rows):
// the same loss curve (20 steps, fp32, relative 1e-5) and the same gradients after step 1 as TP 1.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <tuple>

#include "models/llama_test_util.h"
#include "harness/temp_dir.h"

using llama_test::max_rel_diff;
using llama_test::run_dp_tp;
using llama_test::run_tp;
using llama_test::small_options;

namespace {

const llama_test::RunResult& plain_reference() {
  static const llama_test::RunResult ref = run_tp(small_options(), 1, /*capture_grads=*/true);
  return ref;
}

void expect_matches_plain(const llama_test::RunResult& run) {
  const auto& ref = plain_reference();
  ASSERT_EQ(run.losses.size(), 20u);
  EXPECT_LE(max_rel_diff(ref.losses, run.losses), 1e-5) << "first loss " << run.losses.front() << " vs " << ref.losses.front();
  EXPECT_LT(run.losses.back(), run.losses.front());
  ASSERT_EQ(run.step1_grads.size(), ref.step1_grads.size());
  for (const auto& [name, g] : ref.step1_grads) {
    ASSERT_TRUE(run.step1_grads.contains(name)) << name;
    EXPECT_TRUE(at::allclose(run.step1_grads.at(name), g, 1e-4, 1e-6))
        << name << ": max |diff| " << (run.step1_grads.at(name) - g).abs().max().item<double>();
  }
}

struct Case {
  int dp, tp;
  std::string kind;  // "ddp" or "fsdp"
  bool reshard_after_forward = true;
  bool prefetch = true;  // fsdp: the next block's all-gather in flight while this one computes
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return c.kind + "_dp" + std::to_string(c.dp) + "_tp" + std::to_string(c.tp) +
         (c.kind == "fsdp" && !c.reshard_after_forward ? "_keep" : "") + (c.kind == "fsdp" && !c.prefetch ? "_noprefetch" : "");
}

class LlamaDataParallel : public testing::TestWithParam<Case> {};

TEST_P(LlamaDataParallel, LossCurveAndStep1GradientsMatchPlain) {
  auto options = small_options();
  options.data_parallel = models::data_parallel_from_string(GetParam().kind);
  options.reshard_after_forward = GetParam().reshard_after_forward;
  options.fsdp_prefetch = GetParam().prefetch;
  expect_matches_plain(run_dp_tp(options, GetParam().dp, GetParam().tp, /*capture_grads=*/true));
}

INSTANTIATE_TEST_SUITE_P(Meshes, LlamaDataParallel,
                         testing::Values(Case{2, 1, "ddp"}, Case{2, 2, "ddp"}, Case{2, 1, "fsdp"},
                                         Case{2, 2, "fsdp"}, Case{2, 2, "fsdp", false},
                                         Case{2, 2, "fsdp", true, false}),
                         case_name);

// The 2-D runs (DDP and FSDP) and the 1-D TP 2 run on the same global batch give the same curve.
TEST(LlamaDataParallelMesh, TwoByTwoMatchesTP2) {
  const auto tp2 = run_tp(small_options(), 2);
  for (const char* kind : {"ddp", "fsdp"}) {
    auto options = small_options();
    options.data_parallel = models::data_parallel_from_string(kind);
    EXPECT_LE(max_rel_diff(tp2.losses, run_dp_tp(options, 2, 2).losses), 1e-5) << kind;
  }
}

// FSDP over TP: parameters, gradients and AdamW state per rank are 1/(dp·tp) of the model's, but for the
// norm weights, which TP replicates (1/dp of those).
TEST(LlamaDataParallelMemory, FsdpBytesPerRankAreOneOverDpTimesTp) {
  auto options = small_options();
  options.steps = 2;
  const auto& c = options.model;
  const int64_t h = c.hidden_size, kv = c.num_key_value_heads * c.head_dim(), f = c.intermediate_size, L = c.num_hidden_layers;
  const int64_t tp_sharded = 2 * c.vocab_size * h + L * (2 * h * h + 2 * h * kv + 3 * h * f);
  const int64_t norms = (2 * L + 1) * h;
  const int64_t model_bytes = 4 * (tp_sharded + norms);
  options.data_parallel = models::DataParallel::fsdp;
  const auto run = run_dp_tp(options, 2, 2);
  const int64_t expected = 4 * (tp_sharded / 4 + norms / 2);
  EXPECT_EQ(run.param_bytes_per_rank, expected);
  EXPECT_EQ(run.grad_bytes_per_rank, expected);
  EXPECT_EQ(run.optimizer_bytes_per_rank, 2 * expected);
  const double per_rank = static_cast<double>(run.param_bytes_per_rank + run.grad_bytes_per_rank + run.optimizer_bytes_per_rank);
  // The whole model's parameters, gradients and two AdamW moments are 4 x model_bytes, over dp·tp = 4 ranks.
  EXPECT_LE(per_rank, 1.01 * (4.0 * static_cast<double>(model_bytes)) / 4.0) << "param + grad + AdamW bytes per rank";
  // DDP keeps the TP shards whole on every dp rank: 1/tp.
  options.data_parallel = models::DataParallel::ddp;
  const auto ddp = run_dp_tp(options, 2, 2);
  EXPECT_EQ(ddp.param_bytes_per_rank, 4 * (tp_sharded / 2 + norms));
}

std::string fresh_dir(const std::string& tag) { return dtensor::testing::temp_dir("dp_ckpt_" + tag); }

// Checkpoints cross layouts: a run on the 2-D mesh under FSDP (parameters and AdamW state
// (_StridedShard(0), Shard(0)) and friends) stopped after step 6 resumes on the 1-D TP 2 mesh, and a 1-D
// TP 2 run resumes under FSDP at dp 2 x tp 2, both with the uninterrupted run's losses.
TEST(LlamaDataParallelCheckpoint, ResumesAcrossOneAndTwoDimensionalLayouts) {
  auto options = small_options();
  options.steps = 12;
  options.data_parallel = models::DataParallel::fsdp;
  const auto uninterrupted = run_tp(options, 2);
  const std::vector<double> rest(uninterrupted.losses.begin() + 6, uninterrupted.losses.end());
  for (bool save_2d : {true, false}) {
    auto first = options;
    first.checkpoint_dir = fresh_dir(save_2d ? "2d" : "1d");
    first.checkpoint_every = 6;
    first.stop_after = 6;
    const auto before = save_2d ? run_dp_tp(first, 2, 2) : run_tp(first, 2);
    ASSERT_EQ(before.losses.size(), 6u);
    auto resumed = options;
    resumed.checkpoint_dir = first.checkpoint_dir;
    resumed.resume = true;
    const auto after = save_2d ? run_tp(resumed, 2) : run_dp_tp(resumed, 2, 2);
    ASSERT_EQ(after.losses.size(), 6u);
    EXPECT_LE(max_rel_diff(rest, after.losses), 1e-5) << (save_2d ? "saved at dp2 x tp2, resumed at tp2" : "saved at tp2, resumed at dp2 x tp2");
    std::filesystem::remove_all(first.checkpoint_dir);
  }
}

}  // namespace
