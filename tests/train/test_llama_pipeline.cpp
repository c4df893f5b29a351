// Pipeline parallelism on the Llama decoder (llama/parallelize_pipeline.h over dtensor/pp): stages built by the
// factory hold their layers alone, and a pipelined step gives the losses and gradients of the whole model trained with
// gradient accumulation over the same microbatches — bit for bit at pp 2 and 4 (1F1B, GPipe, ZBH1), and at pp 2 x tp 2
// under torchtitan's plan (sequence parallel: the Shard(1) hidden states travel as local shards) and HF's.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/CPUGeneratorImpl.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/pp/stage.h"
#include "harness/multi_rank.h"
#include "harness/temp_dir.h"
#include "llama/build.h"
#include "llama/parallelize_pipeline.h"
#include "models/llama_test_util.h"
#include "train/options.h"
#include "train/plan_dry_run.h"
#include "train/step.h"

using dtensor::pp::ScheduleKind;

namespace {

llama::LlamaConfig config() {
  llama::LlamaConfig c = llama_test::small_options().model;
  c.num_hidden_layers = 4;
  c.tie_word_embeddings = false;
  return c;
}

constexpr int kBatch = 4, kSeq = 16, kSteps = 2;

std::pair<at::Tensor, at::Tensor> batch(int step) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  const at::Tensor t = at::randint(0, config().vocab_size, {kBatch, kSeq + 1}, gen);
  return {t.narrow(1, 0, kSeq).contiguous(), t.narrow(1, 1, kSeq).contiguous()};
}

struct PipeRun {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> grads;  // full values after step 1
  std::map<int, std::vector<std::string>> stage_params;
};

at::Tensor full_value(const at::Tensor& t) { return dtensor::is_dtensor(t) ? dtensor::full_tensor(t) : t; }

llama::BuildOptions build_options(llama::TPPlan plan) {
  llama::BuildOptions o;
  o.parallelize.plan = plan;
  o.parallelize.tp.loss_parallel = false;
  o.dtype = at::kFloat;
  return o;
}

void sgd_and_record(llama::LlamaForCausalLM& model, int step, bool record, PipeRun& out, std::mutex& mu) {
  at::NoGradGuard g;
  for (auto& item : model->named_parameters()) {
    at::Tensor& p = item.value();
    const at::Tensor full = full_value(p.grad());  // collective over tp: every rank, in the same order
    if (step == 0 && record) {
      std::lock_guard<std::mutex> lock(mu);
      out.grads[item.key()] = full.clone();
    }
    p.sub_(p.grad() * 0.1);
    p.mutable_grad() = at::Tensor();
  }
}

// The whole model at TP tp, gradient accumulation over m microbatches (each loss / m), SGD.
PipeRun reference(int tp, int m, llama::TPPlan plan) {
  PipeRun out;
  std::mutex mu;
  dtensor::testing::run_ranks(tp, [&](int rank, int world) {
    models::ParallelDims dims;
    if (world > 1) dims = models::ParallelDims::from_mesh(dtensor::init_device_mesh("cpu", {world}, {"tp"}));
    auto model = llama::build_model(config(), dims, llama::WeightSource::random(7), build_options(plan));
    for (int step = 0; step < kSteps; ++step) {
      const auto [x, y] = batch(step);
      double sum = 0;
      for (int i = 0; i < m; ++i) {
        at::Tensor loss = train::next_token_loss(model(x.chunk(m)[static_cast<size_t>(i)]), y.chunk(m)[static_cast<size_t>(i)]);
        sum += train::loss_value(loss);
        (loss / static_cast<double>(m)).backward();
      }
      if (rank == 0) out.losses.push_back(sum / m);
      sgd_and_record(model, step, rank == 0, out, mu);
    }
  });
  return out;
}

PipeRun pipelined(int pp, int tp, ScheduleKind kind, int m, llama::TPPlan plan) {
  PipeRun out;
  std::mutex mu;
  dtensor::testing::run_ranks(pp * tp, [&](int rank, int world) {
    (void)world;
    auto mesh = dtensor::init_device_mesh("cpu", {pp, tp}, {"pp", "tp"});
    const int pp_rank = mesh.get_local_rank("pp"), tp_rank = mesh.get_local_rank("tp");
    models::ParallelDims dims;
    if (tp > 1) dims = models::ParallelDims::from_mesh(mesh["tp"]);
    llama::BuildOptions options = build_options(plan);
    options.pipeline_stage = llama::split_stages(config(), pp)[static_cast<size_t>(pp_rank)];
    auto model = llama::build_model(config(), dims, llama::WeightSource::random(7), options);
    if (tp_rank == 0) {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& item : model->named_parameters()) out.stage_params[pp_rank].push_back(item.key());
    }
    std::optional<dtensor::DeviceMesh> boundary;
    if (tp > 1) boundary = mesh["tp"];
    std::optional<dtensor::DeviceMesh> sp;
    if (tp > 1 && plan == llama::TPPlan::torchtitan) sp = mesh["tp"];
    dtensor::pp::PipelineStage stage(llama::stage_forward(model, sp), model->parameters(), pp_rank, pp,
                                     pp > 1 ? &mesh.get_group("pp") : nullptr, boundary);
    dtensor::pp::PipelineSchedule schedule({&stage}, {kind, pp, 1, m}, train::next_token_loss);
    for (int step = 0; step < kSteps; ++step) {
      const auto [x, y] = batch(step);
      const auto losses = schedule.step_batch(x, y);
      if (stage.is_last() && tp_rank == 0) {
        double sum = 0;
        for (const auto& l : losses) sum += train::loss_value(l);
        std::lock_guard<std::mutex> lock(mu);
        out.losses.push_back(sum / m);
      }
      sgd_and_record(model, step, tp_rank == 0, out, mu);
    }
    (void)rank;
  });
  return out;
}

void expect_equal(const PipeRun& ref, const PipeRun& got, const std::string& what, double tol = 0) {
  ASSERT_EQ(got.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(got.losses[i], ref.losses[i], tol * std::abs(ref.losses[i])) << what << " step " << i;
  }
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (const auto& [name, g] : ref.grads) {
    ASSERT_TRUE(got.grads.contains(name)) << what << " " << name;
    const double diff = (got.grads.at(name) - g).abs().max().item<double>();
    EXPECT_LE(diff, tol * std::max(1.0, g.abs().max().item<double>())) << what << " " << name;
  }
}

}  // namespace

TEST(LlamaPipeline, SplitStagesIsTorchtitansEvenSplitOrTheGivenPoints) {
  llama::LlamaConfig c = config();
  c.num_hidden_layers = 7;
  const auto s = llama::split_stages(c, 3);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first, 0);
  EXPECT_EQ(s[0].last, 3);
  EXPECT_EQ(s[1].last, 5);
  EXPECT_EQ(s[2].last, 7);
  EXPECT_TRUE(s[0].embeddings && !s[0].head && s[2].head && !s[1].embeddings);
  const auto p = llama::split_stages(c, 3, llama::split_points_from_string("1,6"));
  EXPECT_EQ(p[0].last, 1);
  EXPECT_EQ(p[1].last, 6);
  using dtensor::testing::error_of;
  EXPECT_NE(error_of([&] { llama::split_stages(c, 3, {4, 2}); }).find("split point 2 must be a layer index in (4, 7)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { llama::split_stages(c, 8); }).find("8 stages for a model of 7 layers"), std::string::npos);
  EXPECT_NE(error_of([] { llama::split_points_from_string("2,x"); }).find("split point 'x'"), std::string::npos);
  llama::LlamaConfig tied = config();
  tied.tie_word_embeddings = true;
  EXPECT_NE(error_of([&] {
              llama::BuildOptions o;
              o.pipeline_stage = llama::split_stages(tied, 2)[0];
              llama::build_model(tied, {}, llama::WeightSource::random(1), o);
            }).find("needs untied embeddings"),
            std::string::npos);
}

TEST(LlamaPipeline, StagesEqualTheWholeModelBitForBit) {
  const PipeRun ref2 = reference(1, 2, llama::TPPlan::hf), ref4 = reference(1, 4, llama::TPPlan::hf);
  const PipeRun pp2 = pipelined(2, 1, ScheduleKind::OneFOneB, 2, llama::TPPlan::hf);
  expect_equal(ref2, pp2, "pp 2 1F1B m 2");
  // Each stage holds its layers alone: stage 0 the embeddings and layers 0-1, stage 1 layers 2-3, the norm and head.
  for (const auto& name : pp2.stage_params.at(0)) {
    EXPECT_TRUE(name.starts_with("model.embed_tokens") || name.starts_with("model.layers.0.") ||
                name.starts_with("model.layers.1."))
        << name;
  }
  for (const auto& name : pp2.stage_params.at(1)) {
    EXPECT_TRUE(name.starts_with("model.layers.2.") || name.starts_with("model.layers.3.") ||
                name.starts_with("model.norm") || name.starts_with("lm_head"))
        << name;
  }
  expect_equal(ref4, pipelined(2, 1, ScheduleKind::GPipe, 4, llama::TPPlan::hf), "pp 2 GPipe m 4");
  expect_equal(ref4, pipelined(2, 1, ScheduleKind::ZBH1, 4, llama::TPPlan::hf), "pp 2 ZBH1 m 4");
  expect_equal(ref4, pipelined(4, 1, ScheduleKind::OneFOneB, 4, llama::TPPlan::hf), "pp 4 1F1B m 4");
}

TEST(LlamaPipeline, PipelineTimesTensorParallelEqualsTensorParallel) {
  for (auto plan : {llama::TPPlan::torchtitan, llama::TPPlan::hf}) {
    const std::string what = "pp 2 x tp 2 " + llama::to_string(plan);
    const PipeRun ref = reference(2, 2, plan);
    expect_equal(ref, pipelined(2, 2, ScheduleKind::OneFOneB, 2, plan), what);
    // and one device's, to fp32 rounding
    expect_equal(reference(1, 2, llama::TPPlan::hf), ref, what + " vs one device", 1e-5);
  }
}

// The trainer at --pp (train/pipeline.h): 20 steps of AdamW with clipping equal pp 1's (the same rows per step, one
// batch) to fp32 rounding, at pp 2 and 4, every single-stage schedule, and beside TP (sequence and loss parallel), DDP
// and FSDP.
namespace {

struct TrainCase {
  int pp, dp, tp;
  std::string schedule;
  int microbatches;
  models::DataParallel kind = models::DataParallel::ddp;
};

train::TrainOptions pp_options() {
  train::TrainOptions o = llama_test::small_options();
  o.model.num_hidden_layers = 4;
  o.model.tie_word_embeddings = false;
  return o;
}

}  // namespace

TEST(LlamaPipeline, TrainingAtPpEqualsOneStage) {
  const auto ref = llama_test::run_tp(pp_options(), 1, /*capture_grads=*/true);
  for (const TrainCase& c : {TrainCase{2, 1, 1, "1F1B", 4}, TrainCase{2, 1, 1, "ZBH1", 2}, TrainCase{4, 1, 1, "GPipe", 4},
                             TrainCase{2, 1, 2, "1F1B", 2}, TrainCase{2, 2, 1, "1F1B", 2},
                             TrainCase{2, 2, 1, "1F1B", 2, models::DataParallel::fsdp}, TrainCase{2, 2, 2, "ZBH1", 2}}) {
    auto o = pp_options();
    o.pp_schedule = c.schedule;
    o.pp_microbatches = c.microbatches;
    o.data_parallel = c.kind;
    const std::string what = "pp " + std::to_string(c.pp) + " x dp " + std::to_string(c.dp) + " (" +
                             models::to_string(c.kind) + ") x tp " + std::to_string(c.tp) + " " + c.schedule + " m " +
                             std::to_string(c.microbatches);
    const auto run = llama_test::run_pp(o, c.pp, c.dp, c.tp, /*capture_grads=*/true);
    EXPECT_LE(llama_test::max_rel_diff(ref.losses, run.losses), 1e-5) << what << ": first loss " << run.losses.front()
                                                                      << " vs " << ref.losses.front();
    ASSERT_EQ(run.step1_grads.size(), ref.step1_grads.size()) << what;
    for (const auto& [name, g] : ref.step1_grads) {
      ASSERT_TRUE(run.step1_grads.contains(name)) << what << " " << name;
      EXPECT_LE((run.step1_grads.at(name) - g).abs().max().item<double>(), 1e-6) << what << " " << name;
    }
    // Each stage holds its layers alone: rank 0 (stage 0) fewer parameter bytes than the whole model.
    EXPECT_LT(run.param_bytes_per_rank, ref.param_bytes_per_rank) << what;
    // The measured bubble: rank 0 waited for gradients in every step.
    EXPECT_GT(run.steps.back().pp_wait_ms, 0.0) << what;
  }
}

TEST(LlamaPipeline, TheTrainerRefusesWhatThePipelineDoesNotCarry) {
  using dtensor::testing::error_of;
  auto o = pp_options();
  o.pp = 2;
  o.pp_schedule = "Interleaved1F1B";
  EXPECT_NE(error_of([&] { train::check_options(o, 2); }).find("--pp-schedule Interleaved1F1B (llama_train runs one stage"),
            std::string::npos);
  o.pp_schedule = "1F1B";
  o.pp_microbatches = 3;
  EXPECT_NE(error_of([&] { train::check_options(o, 2); }).find("--pp-microbatches 3 does not divide a dp rank's 4 rows"),
            std::string::npos);
  o.pp_microbatches = 2;
  o.tp = 1;
  EXPECT_NE(error_of([&] { train::check_options(o, 4); }).find("--pp 2 x --dp 1 x --tp 1 != world size 4"), std::string::npos)
      << error_of([&] { train::check_options(o, 4); });
  o.model.tie_word_embeddings = true;
  EXPECT_NE(error_of([&] { train::check_options(o, 2); }).find("needs untied embeddings"), std::string::npos);
  o.model.tie_word_embeddings = false;
  o.pp_split_points = "1,2";
  EXPECT_NE(error_of([&] { train::check_options(o, 2); }).find("2 split points for 2 stages"), std::string::npos);
}

// llama_plan --pp: each stage's dry run on one microbatch, and the schedule's numbers.
TEST(LlamaPipeline, TheDryRunCutsTheModelAsTheTrainerDoes) {
  train::PlanOptions o(pp_options());
  o.tp = 2;
  o.pp = 2;
  o.pp_microbatches = 4;
  o.mixed_precision = train::MixedPrecision::off;
  const train::PipelinePlan plan = train::dry_run_llama_pipeline(o);
  ASSERT_EQ(plan.stages.size(), 2u);
  EXPECT_DOUBLE_EQ(plan.bubble_fraction, 1.0 / 5.0);  // 1F1B: (p - 1) / (m + p - 1)
  EXPECT_EQ(plan.stages[0].in_flight, 2);
  EXPECT_EQ(plan.stages[1].in_flight, 1);
  EXPECT_EQ(plan.stages[0].layers.last, 2);
  // One microbatch of batch 4 / 4 rows: sequence parallel's rows of 16 / 2 positions of 64 fp32 values, each way.
  EXPECT_EQ(plan.p2p_bytes_per_step, 2 * 4 * (1 * 8 * 64 * 4));
  // The stages' parameters are the whole model's, cut in two.
  train::PlanOptions whole = o;
  whole.pp = 1;
  const auto full = train::dry_run_llama(whole);
  EXPECT_EQ(plan.stages[0].report.ranks.front().param_bytes + plan.stages[1].report.ranks.front().param_bytes,
            full.ranks.front().param_bytes);
  EXPECT_GT(plan.stages[0].peak_bytes_with_schedule, plan.stages[0].report.ranks.front().peak_bytes);
}

// A checkpoint saved by the stages of pp 2 x tp 2 (each its own layers and AdamW state, under the whole model's names)
// resumes at pp 1, at pp 2 and at pp 4 with the uninterrupted run's losses.
TEST(LlamaPipeline, ACheckpointSavedAtPp2ResumesAtPp1And4) {
  auto options = pp_options();
  options.steps = 8;
  options.pp_microbatches = 2;
  const auto uninterrupted = llama_test::run_tp(options, 1);
  const std::string dir = dtensor::testing::temp_dir("pp_checkpoint");
  auto first = options;
  first.checkpoint_dir = dir;
  first.checkpoint_every = 4;
  first.stop_after = 4;
  const auto before = llama_test::run_pp(first, 2, 1, 2);
  ASSERT_EQ(before.losses.size(), 4u);
  const std::vector<double> rest(uninterrupted.losses.begin() + 4, uninterrupted.losses.end());
  struct Resume { int pp, tp; };
  for (const Resume r : {Resume{1, 1}, Resume{2, 1}, Resume{4, 1}}) {
    auto resumed = options;
    resumed.checkpoint_dir = dir;
    resumed.resume = true;
    const auto after = r.pp == 1 ? llama_test::run_tp(resumed, r.tp) : llama_test::run_pp(resumed, r.pp, 1, r.tp);
    ASSERT_EQ(after.steps.size(), 4u) << "pp " << r.pp;
    EXPECT_EQ(after.steps.front().step, 4);
    EXPECT_LE(llama_test::max_rel_diff(rest, after.losses), 1e-5) << "resumed at pp " << r.pp;
  }
}
