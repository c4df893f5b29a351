// llama_train --float8 (torchtitan's float8 converter; dtensor/float8/float8_linear.h): the decoder's projections
// compute through float8 matmuls under bf16 mixed precision, lm_head stays bf16. The losses follow the bf16 run's
// within what e4m3 / e5m2 rounding allows, at TP 1 and TP 2, for both recipes.
#include <gtest/gtest.h>

#include <string>

#include "dtensor/float8/float8_linear.h"
#include "models/llama_test_util.h"
#include "train/loop.h"

namespace {

using llama_test::max_rel_diff;

train::TrainOptions float8_options(dtensor::Float8Recipe recipe) {
  auto o = llama_test::small_options();
  o.mixed_precision = train::MixedPrecision::bf16;
  o.float8 = true;
  o.float8_recipe = recipe;
  // Named, not auto (timed: either could win), so that every run takes the same path: the exact emulation for
  // tensorwise, the bf16 one for rowwise (the test trains in bf16). _scaled_mm itself: tests/float8.
  o.float8_matmul = recipe == dtensor::Float8Recipe::tensorwise ? dtensor::Float8MatmulKind::emulated
                                                                : dtensor::Float8MatmulKind::emulated_bf16;
  return o;
}

// Float8 against bf16 over 20 steps of the small model, bounds ~4-8x the measured worst (the test prints them);
// every run is deterministic.
constexpr double kFloat8VsBf16 = 5e-3;  // measured 5.6e-4 (tensorwise, emulated), 1.8e-3 (rowwise, emulated_bf16)
// TP 2 against TP 1, both float8 (global scales: the same quantization; partial sums round differently).
constexpr double kTp2VsTp1 = 2e-3;  // measured 3.8e-4, 5.1e-4

}  // namespace

TEST(Float8Training, LossesFollowBf16AtTp1AndTp2) {
  auto bf16 = llama_test::small_options();
  bf16.mixed_precision = train::MixedPrecision::bf16;
  const auto reference = llama_test::run_tp(bf16, 1);
  const auto bf16_tp2 = llama_test::run_tp(bf16, 2);
  for (const auto recipe : {dtensor::Float8Recipe::tensorwise, dtensor::Float8Recipe::rowwise}) {
    const auto o = float8_options(recipe);
    const auto tp1 = llama_test::run_tp(o, 1);
    const auto tp2 = llama_test::run_tp(o, 2);
    ASSERT_EQ(tp1.losses.size(), 20u);
    const double vs_bf16 = max_rel_diff(tp1.losses, reference.losses);
    const double tp_diff = max_rel_diff(tp2.losses, tp1.losses);
    std::printf("float8 %s: vs bf16 %.2e, TP 2 vs TP 1 %.2e (loss %.3f -> %.3f)\n", dtensor::to_string(recipe).c_str(),
                vs_bf16, tp_diff, tp1.losses.front(), tp1.losses.back());
    EXPECT_NE(tp1.losses, reference.losses) << "float8 changed nothing";
    EXPECT_LT(vs_bf16, kFloat8VsBf16);
    EXPECT_LT(tp_diff, kTp2VsTp1);
    EXPECT_LT(tp1.losses.back(), tp1.losses.front() - 1.0);
    // At TP 2 with sequence parallel, tensorwise takes the float8 styles: each layer's two input all-gathers
    // (attention, MLP) and two backward all-gathers (o_proj's and down_proj's output gradients) move 1 byte per
    // element instead of bf16's 2; the embedding's and lm_head's stay bf16. Rowwise keeps the plain styles.
    const auto bytes = [](const llama_test::RunResult& r) { return r.steps.at(0).fwd_bwd_bytes.at("all_gather"); };
    const int64_t layers = o.model.num_hidden_layers, per_gather = bytes(bf16_tp2) / (4 * layers + 2);  // bf16 bytes
    EXPECT_EQ(bytes(bf16_tp2) % (4 * layers + 2), 0);
    EXPECT_EQ(bytes(tp2), recipe == dtensor::Float8Recipe::tensorwise ? 4 * layers * per_gather / 2 + 2 * per_gather
                                                                      : bytes(bf16_tp2));
  }
}
