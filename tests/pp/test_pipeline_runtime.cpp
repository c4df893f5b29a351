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

using dtensor::pp::ScheduleKind;
using dtensor::pp::ScheduleSpec;
using dtensor::testing::seeded_randn;

namespace {

constexpr int kLayers = 8, kDim = 16, kBatch = 8;

// Layer i: y = tanh(x W_i^T + b_i), the last without tanh; weights from their own seeds (the same on every rank).
struct Layer {
  at::Tensor w, b;
};
std::vector<Layer> make_layers() {
  std::vector<Layer> out;
  for (int i = 0; i < kLayers; ++i) {
    out.push_back({(seeded_randn(100 + i, {kDim, kDim}) / 4.0).requires_grad_(),
                   (seeded_randn(200 + i, {kDim}) * 0.1).requires_grad_()});
  }
  return out;
}
at::Tensor run_layers(const std::vector<Layer>& layers, int first, int last, at::Tensor x) {
  for (int i = first; i < last; ++i) {
    x = at::linear(x, layers[static_cast<size_t>(i)].w, layers[static_cast<size_t>(i)].b);
    if (i + 1 < kLayers) x = at::tanh(x);
  }
  return x;
}
at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return at::mse_loss(out, target); }

struct Result {
  std::vector<double> losses;                 // per step, the mean over microbatches
  std::map<std::string, at::Tensor> grads;    // after the first step
};

// The unsplit stack, gradient accumulation over m microbatches (loss / m each), SGD: the reference.
Result reference(int m, int steps) {
  auto layers = make_layers();
  Result r;
  for (int step = 0; step < steps; ++step) {
    const auto xs = seeded_randn(300 + step, {kBatch, kDim}).chunk(m), ys = seeded_randn(400 + step, {kBatch, kDim}).chunk(m);
    double sum = 0;
    for (int i = 0; i < m; ++i) {
      at::Tensor loss = mse(run_layers(layers, 0, kLayers, xs[static_cast<size_t>(i)]), ys[static_cast<size_t>(i)]);
      sum += loss.item<double>();
      (loss / static_cast<double>(m)).backward();
    }
    r.losses.push_back(sum / m);
    at::NoGradGuard g;
    for (int i = 0; i < kLayers; ++i) {
      auto& l = layers[static_cast<size_t>(i)];
      if (step == 0) {
        r.grads["layers." + std::to_string(i) + ".weight"] = l.w.grad().clone();
        r.grads["layers." + std::to_string(i) + ".bias"] = l.b.grad().clone();
      }
      l.w.sub_(l.w.grad() * 0.05);
      l.b.sub_(l.b.grad() * 0.05);
      l.w.mutable_grad().zero_();
      l.b.mutable_grad().zero_();
    }
  }
  return r;
}

Result pipelined(const ScheduleSpec& spec, int steps) {
  Result out;
  std::mutex mu;
  dtensor::testing::run_ranks(spec.pp, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"pp"});
    dtensor::ProcessGroup* group = world > 1 ? &mesh.get_group(0) : nullptr;
    auto layers = make_layers();
    const int per_stage = kLayers / spec.num_stages();
    std::vector<std::unique_ptr<dtensor::pp::PipelineStage>> stages;
    std::vector<dtensor::pp::PipelineStage*> mine;
    for (int s : spec.stages_of(rank)) {
      const int first = s * per_stage, last = first + per_stage;
      std::vector<at::Tensor> params;
      for (int i = first; i < last; ++i) {
        params.push_back(layers[static_cast<size_t>(i)].w);
        params.push_back(layers[static_cast<size_t>(i)].b);
      }
      stages.push_back(std::make_unique<dtensor::pp::PipelineStage>(
          [&layers, first, last](const at::Tensor& x) { return run_layers(layers, first, last, x); }, params, s,
          spec.num_stages(), group));
      mine.push_back(stages.back().get());
    }
    dtensor::pp::PipelineSchedule schedule(mine, spec, mse);
    const bool first_rank = spec.stage_rank(0) == rank, last_rank = spec.stage_rank(spec.num_stages() - 1) == rank;
    for (int step = 0; step < steps; ++step) {
      const auto x = seeded_randn(300 + step, {kBatch, kDim}), y = seeded_randn(400 + step, {kBatch, kDim});
      const auto losses = schedule.step_batch(first_rank ? x : at::Tensor(), last_rank ? y : at::Tensor());
      std::lock_guard<std::mutex> lock(mu);
      if (last_rank) {
        ASSERT_EQ(static_cast<int>(losses.size()), spec.microbatches);
        double sum = 0;
        for (const auto& l : losses) sum += l.item<double>();
        out.losses.push_back(sum / spec.microbatches);
      } else {
        EXPECT_TRUE(losses.empty());
      }
      at::NoGradGuard g;
      for (auto* st : mine) {
        for (int i = st->stage_index() * per_stage; i < (st->stage_index() + 1) * per_stage; ++i) {
          auto& l = layers[static_cast<size_t>(i)];
          if (step == 0) {
            out.grads["layers." + std::to_string(i) + ".weight"] = l.w.grad().clone();
            out.grads["layers." + std::to_string(i) + ".bias"] = l.b.grad().clone();
          }
          l.w.sub_(l.w.grad() * 0.05);
          l.b.sub_(l.b.grad() * 0.05);
          l.w.mutable_grad().zero_();
          l.b.mutable_grad().zero_();
        }
      }
    }
    // What the step measured: bytes of activations and gradients (and one header per boundary per step).
    const auto& st = schedule.last_stats();
    EXPECT_GT(st.ms, 0.0);
    if (world > 1) EXPECT_GT(st.bytes_sent, 0);
  });
  return out;
}

void expect_bit_equal(const Result& ref, const Result& got, const std::string& what) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_EQ(got.losses[i], ref.losses[i]) << what << " step " << i;
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (const auto& [name, g] : ref.grads) {
    ASSERT_TRUE(got.grads.contains(name)) << what << " " << name;
    EXPECT_TRUE(at::equal(got.grads.at(name), g)) << what << " " << name << ": max |diff| "
                                                  << (got.grads.at(name) - g).abs().max().item<double>();
  }
}

}  // namespace

TEST(PipelineRuntime, EveryScheduleEqualsGradientAccumulationBitForBit) {
  constexpr int kSteps = 3;
  std::vector<ScheduleSpec> specs = {
      {ScheduleKind::GPipe, 2, 1, 4},  {ScheduleKind::OneFOneB, 2, 1, 4}, {ScheduleKind::OneFOneB, 4, 1, 8},
      {ScheduleKind::OneFOneB, 4, 1, 2}, {ScheduleKind::ZBH1, 2, 1, 4},   {ScheduleKind::ZBH1, 4, 1, 4},
      {ScheduleKind::Interleaved1F1B, 2, 2, 4}, {ScheduleKind::Interleaved1F1B, 2, 4, 2},
      {ScheduleKind::Interleaved1F1B, 1, 2, 2},  // two stages on one rank: the hand-off in memory
  };
  std::map<int, Result> refs;
  for (const auto& spec : specs) {
    if (!refs.contains(spec.microbatches)) refs[spec.microbatches] = reference(spec.microbatches, kSteps);
    const std::string what = dtensor::pp::to_string(spec.kind) + " pp " + std::to_string(spec.pp) + " v " +
                             std::to_string(spec.stages_per_rank) + " m " + std::to_string(spec.microbatches);
    expect_bit_equal(refs.at(spec.microbatches), pipelined(spec, kSteps), what);
  }
}

TEST(PipelineRuntime, AStageOfTheWrongRankAndAnUnevenBatchAreRefused) {
  dtensor::testing::run_ranks(2, [](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world}, {"pp"});
    auto fwd = [](const at::Tensor& x) { return x * 2; };
    dtensor::pp::PipelineStage wrong(fwd, {}, 1 - rank, 2, &mesh.get_group(0));
    const std::string err = dtensor::testing::error_of(
        [&] { dtensor::pp::PipelineSchedule({&wrong}, {ScheduleKind::OneFOneB, 2, 1, 2}, mse); });
    EXPECT_NE(err.find("pp rank " + std::to_string(rank) + " of 1F1B holds stages [" + std::to_string(rank) + "]"),
              std::string::npos)
        << err;
    dtensor::pp::PipelineStage right(fwd, {}, rank, 2, &mesh.get_group(0));
    dtensor::pp::PipelineSchedule schedule({&right}, {ScheduleKind::OneFOneB, 2, 1, 2}, mse);
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
    dtensor::pp::PipelineSchedule schedule({&stage}, {ScheduleKind::OneFOneB, 2, 1, 2}, mse);
    if (rank == 0) return;  // stage 0 never runs its step: stage 1 waits for an activation that does not come
    schedule.step_batch(at::Tensor(), at::ones({2, 4}));
  }, options);
  // (rank 0's own exit waits for rank 1 at the world's barrier and may time out too: not what this checks)
  EXPECT_NE(errors[1].find("pipeline stage 1 1RECV_F0 (pp rank 1, peer pp rank 0) receiving the activation's header "
                           "failed"),
            std::string::npos)
      << errors[1];
}
