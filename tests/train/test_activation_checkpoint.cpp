// Activation checkpointing in training (llama::apply_ac, dtensor/nn/checkpoint.h), fp32: every mode gives losses and
// step-1 gradients bit-equal to no checkpointing, at TP 1 and 2, DDP and FSDP over dp 2 (the recomputed forwards run
// the same ops on the same values, and the gradients reach the parameters through their own accumulation and hooks);
// full wraps every block, selective every Nth.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>

#include "llama/parallelize.h"
#include "models/llama_test_util.h"

using llama_test::run_dp_tp;
using llama_test::run_tp;
using llama_test::small_options;

namespace {

struct Layout {
  int dp, tp;
  std::string kind;
};

llama_test::RunResult run(train::TrainOptions o, const Layout& l) {
  o.data_parallel = models::data_parallel_from_string(l.kind);
  return l.dp > 1 ? run_dp_tp(o, l.dp, l.tp, /*capture_grads=*/true) : run_tp(o, l.tp, /*capture_grads=*/true);
}

class ActivationCheckpoint : public testing::TestWithParam<Layout> {};

TEST_P(ActivationCheckpoint, FullAndSelectiveAreBitEqualToNone) {
  auto options = small_options();
  options.steps = 5;
  options.model.num_hidden_layers = 3;
  const auto none = run(options, GetParam());
  for (const auto& [mode, every] : {std::pair{llama::ACMode::full, 1}, std::pair{llama::ACMode::selective, 2}}) {
    auto o = options;
    o.ac = {.mode = mode, .selective_every = every};
    const auto ac = run(o, GetParam());
    const std::string what = llama::to_string(mode);
    // The recompute ran: under TP it issues its forward's collectives again, in the backward.
    auto gathers = [](const llama_test::RunResult& r) {
      const auto& c = r.steps.back().fwd_bwd_counts;
      return c.contains("all_gather") ? c.at("all_gather") : 0;
    };
    if (GetParam().tp > 1) EXPECT_GT(gathers(ac), gathers(none)) << what;
    ASSERT_EQ(ac.losses.size(), none.losses.size()) << what;
    for (size_t i = 0; i < none.losses.size(); ++i) EXPECT_EQ(ac.losses[i], none.losses[i]) << what << " step " << i + 1;
    ASSERT_EQ(ac.step1_grads.size(), none.step1_grads.size());
    for (const auto& [name, g] : none.step1_grads) {
      EXPECT_TRUE(at::equal(ac.step1_grads.at(name), g))
          << what << " " << name << ": max |diff| " << (ac.step1_grads.at(name) - g).abs().max().item<double>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ActivationCheckpoint,
                         testing::Values(Layout{1, 1, "ddp"}, Layout{1, 2, "ddp"}, Layout{2, 2, "ddp"}, Layout{2, 2, "fsdp"}),
                         [](const testing::TestParamInfo<Layout>& i) {
                           return i.param.kind + "_dp" + std::to_string(i.param.dp) + "_tp" + std::to_string(i.param.tp);
                         });

TEST(ActivationCheckpointBlocks, FullWrapsEveryBlockSelectiveEveryNth) {
  auto config = small_options().model;
  config.num_hidden_layers = 5;
  for (const auto& [mode, every, expected] :
       {std::tuple{llama::ACMode::none, 1, 0}, std::tuple{llama::ACMode::full, 1, 5},
        std::tuple{llama::ACMode::selective, 2, 2}, std::tuple{llama::ACMode::selective, 3, 1}}) {
    llama::LlamaForCausalLM model(config);
    EXPECT_EQ(llama::apply_ac(model, {.mode = mode, .selective_every = every}), expected);
  }
  EXPECT_THROW(llama::ac_mode_from_string("op"), std::exception);
}

}  // namespace
