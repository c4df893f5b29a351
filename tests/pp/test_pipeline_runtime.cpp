// The pipeline runtime (dtensor/pp/stage.h) with ranks as threads over real Gloo groups: a stack of Linear + tanh
// layers split into stages gives the losses and gradients of the unsplit stack trained with gradient accumulation over
// the same microbatches, bit for bit, for every schedule at pp 2 and 4; a stage's stray recv and a peer's death are
// named errors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/pp/stage.h"
#include "harness/multi_rank.h"
#include "pp/toy_stack.h"

using dtensor::pp::ScheduleKind;
using dtensor::pp::ScheduleSpec;
using dtensor::testing::seeded_randn;

namespace {

constexpr int kLayers = 8, kDim = 16, kBatch = 8, kSteps = 3;

std::vector<pp_test::Layer> make_layers() {
  std::vector<pp_test::Layer> out;
  for (int i = 0; i < kLayers; ++i) {
    out.push_back({(seeded_randn(100 + i, {kDim, kDim}) / 4.0).requires_grad_(),
                   (seeded_randn(200 + i, {kDim}) * 0.1).requires_grad_()});
  }
  return out;
}
at::Tensor steps_of(uint64_t seed) {
  std::vector<at::Tensor> out;
  for (int i = 0; i < kSteps; ++i) out.push_back(seeded_randn(seed + i, {kBatch, kDim}));
  return at::stack(out);
}

void expect_bit_equal(const pp_test::Result& ref, const pp_test::Result& got, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_EQ(got.losses[i], ref.losses[i]) << what << " step " << i;
  auto same = [&](const std::map<std::string, at::Tensor>& want, const std::map<std::string, at::Tensor>& have) {
    ASSERT_EQ(have.size(), want.size()) << what;
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(have.contains(name)) << what << " " << name;
      EXPECT_TRUE(at::equal(have.at(name), t)) << what << " " << name << ": max |diff| "
                                               << (have.at(name) - t).abs().max().item<double>();
    }
  };
  same(ref.grads, got.grads);
  same(ref.final_params, got.final_params);
}

}  // namespace

TEST(PipelineRuntime, EveryScheduleEqualsGradientAccumulationBitForBit) {
  const std::vector<ScheduleSpec> specs = {
      {ScheduleKind::GPipe, 2, 1, 4},  {ScheduleKind::OneFOneB, 2, 1, 4}, {ScheduleKind::OneFOneB, 4, 1, 8},
      {ScheduleKind::OneFOneB, 4, 1, 2}, {ScheduleKind::ZBH1, 2, 1, 4},   {ScheduleKind::ZBH1, 4, 1, 4},
      {ScheduleKind::Interleaved1F1B, 2, 2, 4}, {ScheduleKind::Interleaved1F1B, 2, 4, 2},
      {ScheduleKind::Interleaved1F1B, 1, 2, 2},  // two stages on one rank: the hand-off in memory
  };
  const auto layers = make_layers();
  const at::Tensor xs = steps_of(300), ys = steps_of(400);
  std::map<int, pp_test::Result> refs;
  for (const auto& spec : specs) {
    if (!refs.contains(spec.microbatches)) {
      refs[spec.microbatches] = pp_test::train_reference(layers, xs, ys, spec.microbatches, 0.05);
    }
    const std::string what = dtensor::pp::to_string(spec.kind) + " pp " + std::to_string(spec.pp) + " v " +
                             std::to_string(spec.stages_per_rank) + " m " + std::to_string(spec.microbatches);
    expect_bit_equal(refs.at(spec.microbatches), pp_test::train_pipelined(layers, xs, ys, spec, 0.05), what);
  }
}

TEST(PipelineRuntime, AStepMeasuresItsTimeAndTheBytesItSends) {
  dtensor::testing::run_ranks(2, [](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"pp"});
    at::Tensor w = at::ones({4, 4}).requires_grad_();
    dtensor::pp::PipelineStage stage([w](const at::Tensor& x) { return at::matmul(x, w); }, {w}, rank, 2,
                                     &mesh.get_group(0));
    dtensor::pp::PipelineSchedule schedule({&stage}, {ScheduleKind::OneFOneB, 2, 1, 2}, pp_test::mse);
    const auto losses = schedule.step_batch(at::ones({4, 4}), at::zeros({4, 4}));
    EXPECT_EQ(losses.size(), rank == 1 ? 2u : 0u);
    const auto& st = schedule.last_stats();
    EXPECT_GT(st.ms, 0.0);
    // Rank 0 sends two activations [2, 4] fp32 and one 512-byte header; rank 1 two gradients of the same size.
    EXPECT_EQ(st.bytes_sent, rank == 0 ? 2 * 32 + 512 : 2 * 32);
    EXPECT_EQ(st.messages_sent, rank == 0 ? 3 : 2);
  });
}

TEST(PipelineRuntime, AStageOfTheWrongRankAndAnUnevenBatchAreRefused) {
  dtensor::testing::run_ranks(2, [](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"pp"});
    auto fwd = [](const at::Tensor& x) { return x * 2; };
    dtensor::pp::PipelineStage wrong(fwd, {}, 1 - rank, 2, &mesh.get_group(0));
    const std::string err = dtensor::testing::error_of(
        [&] { dtensor::pp::PipelineSchedule({&wrong}, {ScheduleKind::OneFOneB, 2, 1, 2}, pp_test::mse); });
    EXPECT_NE(err.find("pp rank " + std::to_string(rank) + " of 1F1B holds stages [" + std::to_string(rank) + "]"),
              std::string::npos)
        << err;
    dtensor::pp::PipelineStage right(fwd, {}, rank, 2, &mesh.get_group(0));
    dtensor::pp::PipelineSchedule schedule({&right}, {ScheduleKind::OneFOneB, 2, 1, 2}, pp_test::mse);
    const std::string uneven = dtensor::testing::error_of([&] { schedule.step_batch(at::ones({3, 2}), at::ones({3, 2})); });
    EXPECT_NE(uneven.find("the input's batch of 3 does not split into 2 microbatches"), std::string::npos) << uneven;
  });
}

TEST(PipelineRuntime, APeerThatNeverSendsIsANamedErrorWithinTheTimeout) {
  dtensor::testing::RunOptions options;
  options.collective_timeout = std::chrono::milliseconds(1500);
  options.expect_all_succeed = false;
  const auto errors = dtensor::testing::run_ranks(2, [](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"pp"});
    at::Tensor w = at::ones({4, 4}).requires_grad_();
    dtensor::pp::PipelineStage stage([w](const at::Tensor& x) { return at::matmul(x, w); }, {w}, rank, 2,
                                     &mesh.get_group(0));
    dtensor::pp::PipelineSchedule schedule({&stage}, {ScheduleKind::OneFOneB, 2, 1, 2}, pp_test::mse);
    if (rank == 0) return;  // stage 0 never runs its step: stage 1 waits for an activation that does not come
    schedule.step_batch(at::Tensor(), at::ones({2, 4}));
  }, options);
  // (rank 0's own exit waits for rank 1 at the world's barrier and may time out too: not what this checks)
  EXPECT_NE(errors[1].find("pipeline stage 1 1RECV_F0 (pp rank 1, peer pp rank 0) receiving the activation's header "
                           "failed"),
            std::string::npos)
      << errors[1];
}
