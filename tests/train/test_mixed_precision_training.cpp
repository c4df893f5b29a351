// llama_train's default precision, --mixed-precision bf16 (train/options.h, llama::apply_data_parallel): fp32 masters
// and AdamW state, forward and backward in bf16, gradient reductions in fp32; on TP alone, DDP x TP and FSDP x TP.
// Checked: what is fp32 and what is bf16 (the parameters, the gradients, and each collective's bytes against the fp32
// run's), the losses against the fp32 run's, and the parallelisms against TP 1 within the bound bf16 allows.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "models/llama_test_util.h"
#include "train/loop.h"

namespace {

using llama_test::max_rel_diff;

train::TrainOptions with(train::MixedPrecision mp) {
  auto o = llama_test::small_options();
  o.mixed_precision = mp;
  return o;
}

int64_t fwd_bwd_bytes(const llama_test::RunResult& r, const std::string& kind) {
  const auto& bytes = r.steps.at(0).fwd_bwd_bytes;
  return bytes.contains(kind) ? bytes.at(kind) : 0;
}

// bf16's 8-bit mantissa against fp32 over 20 AdamW steps of the small model: measured 3.9e-4 at most (TP 1). The
// runs are deterministic (the same kernels and reduction orders every time); the bound is 10x the measurement.
constexpr double kBf16VsFp32 = 4e-3;
// The parallelisms against TP 1, both in bf16 (other reduction orders round differently): measured 2.3e-4 at most.
constexpr double kBf16VsBf16 = 2e-3;

}  // namespace

TEST(MixedPrecisionTraining, Fp32MastersBf16ComputeFollowsTheFp32Run) {
  const auto fp32 = llama_test::run_tp(with(train::MixedPrecision::off), 1);
  const auto bf16 = llama_test::run_tp(with(train::MixedPrecision::bf16), 1, /*capture_grads=*/true);
  ASSERT_EQ(bf16.losses.size(), 20u);
  // The masters, their gradients and AdamW's state stay fp32: the same bytes as the fp32 run.
  EXPECT_EQ(bf16.param_bytes_per_rank, fp32.param_bytes_per_rank);
  EXPECT_EQ(bf16.grad_bytes_per_rank, fp32.grad_bytes_per_rank);
  EXPECT_EQ(bf16.optimizer_bytes_per_rank, fp32.optimizer_bytes_per_rank);
  for (const auto& [name, g] : bf16.step1_grads) EXPECT_EQ(g.scalar_type(), at::kFloat) << name;
  // The computation is bf16 (not the fp32 run again) and follows the fp32 run.
  EXPECT_NE(bf16.losses, fp32.losses);
  const double diff = max_rel_diff(bf16.losses, fp32.losses);
  std::printf("bf16 vs fp32 losses at TP 1, 20 steps: max relative difference %.2e\n", diff);
  EXPECT_LT(diff, kBf16VsFp32);
  EXPECT_LT(bf16.losses.back(), bf16.losses.front() - 1.0);
}

// TP 2 with sequence parallel: the activations' all-gathers and reduce-scatters move bf16 (half the fp32 run's bytes);
// the all-reduces (loss parallel's, on the fp32 loss, and the gradient sync of the norms' Partial gradients, on the
// fp32 masters' .grad) the fp32 run's bytes.
TEST(MixedPrecisionTraining, TpActivationsInBf16GradientReductionsInFp32) {
  const auto fp32 = llama_test::run_tp(with(train::MixedPrecision::off), 2);
  const auto bf16 = llama_test::run_tp(with(train::MixedPrecision::bf16), 2);
  for (const char* kind : {"all_gather", "reduce_scatter"}) {
    EXPECT_GT(fwd_bwd_bytes(fp32, kind), 0) << kind;
    EXPECT_EQ(2 * fwd_bwd_bytes(bf16, kind), fwd_bwd_bytes(fp32, kind)) << kind;
  }
  EXPECT_GT(fwd_bwd_bytes(fp32, "all_reduce"), 0);
  EXPECT_EQ(fwd_bwd_bytes(bf16, "all_reduce"), fwd_bwd_bytes(fp32, "all_reduce"));
  EXPECT_EQ(bf16.steps.at(0).fwd_bwd_counts, fp32.steps.at(0).fwd_bwd_counts);
  EXPECT_EQ(bf16.param_bytes_per_rank, fp32.param_bytes_per_rank);
}

// FSDP2's MixedPrecisionPolicy(bf16, fp32), dp 2: the parameters gathered in bf16 (half the bytes), the gradients
// reduce-scattered in fp32 (the fp32 run's bytes), the shards and their gradients fp32.
TEST(MixedPrecisionTraining, FsdpGathersInBf16ReduceScattersInFp32) {
  auto off = with(train::MixedPrecision::off);
  auto on = with(train::MixedPrecision::bf16);
  off.data_parallel = on.data_parallel = models::DataParallel::fsdp;
  const auto fp32 = llama_test::run_dp_tp(off, 2, 1);
  const auto bf16 = llama_test::run_dp_tp(on, 2, 1);
  EXPECT_GT(fwd_bwd_bytes(fp32, "all_gather"), 0);
  EXPECT_EQ(2 * fwd_bwd_bytes(bf16, "all_gather"), fwd_bwd_bytes(fp32, "all_gather"));
  EXPECT_GT(fwd_bwd_bytes(fp32, "reduce_scatter"), 0);
  EXPECT_EQ(fwd_bwd_bytes(bf16, "reduce_scatter"), fwd_bwd_bytes(fp32, "reduce_scatter"));
  EXPECT_EQ(bf16.param_bytes_per_rank, fp32.param_bytes_per_rank);
  EXPECT_EQ(bf16.optimizer_bytes_per_rank, fp32.optimizer_bytes_per_rank);
}

// The same training at TP 1, TP 2, DDP 2 x TP 2 and FSDP 2 x TP 2, all in bf16: within kBf16VsBf16 of each other.
TEST(MixedPrecisionTraining, ParallelismsAgreeAsCloselyAsBf16Allows) {
  const auto on = with(train::MixedPrecision::bf16);
  const auto tp1 = llama_test::run_tp(on, 1);
  auto ddp = on, fsdp = on;
  fsdp.data_parallel = models::DataParallel::fsdp;
  const std::map<std::string, llama_test::RunResult> runs = {
      {"tp 2", llama_test::run_tp(on, 2)},
      {"ddp 2 x tp 2", llama_test::run_dp_tp(ddp, 2, 2)},
      {"fsdp 2 x tp 2", llama_test::run_dp_tp(fsdp, 2, 2)},
  };
  for (const auto& [name, run] : runs) {
    const double diff = max_rel_diff(run.losses, tp1.losses);
    std::printf("bf16 %s vs TP 1 over 20 steps: max relative loss difference %.2e\n", name.c_str(), diff);
    EXPECT_LT(diff, kBf16VsBf16) << name;
  }
}
