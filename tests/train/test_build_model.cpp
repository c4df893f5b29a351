// train::build_model, llama_train's meta-first build (the meta model takes the TP plan, each rank allocates and
// fills only its shards, then DDP / FSDP takes them), against the reference path make_model + parallelize (every
// rank the whole model, then the plan cuts it): the same losses and step-1 gradients, bit for bit, on each
// parallelism; the TP plan's gradient sync (one bucketed all-reduce of the Partial gradients) survives the
// materialization; and a rank's allocations stay its shards plus one tensor's init value.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <string>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/dp/gradient_sync.h"
#include "harness/multi_rank.h"
#include "models/alloc_counter.h"
#include "models/llama_test_util.h"
#include "train/loop.h"

using llama_test::Build;

namespace {

struct Case {
  int dp, tp;
  std::string data_parallel;  // with dp > 1
  std::string plan;           // "torchtitan" (sequence and loss parallel) or "hf"
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return (c.dp > 1 ? c.data_parallel + "_dp" + std::to_string(c.dp) + "_" : std::string()) + "tp" +
         std::to_string(c.tp) + "_" + c.plan;
}

class BuildModel : public testing::TestWithParam<Case> {};

TEST_P(BuildModel, MetaFirstTrainsBitForBitAsTheWholeModelPath) {
  const Case& c = GetParam();
  auto options = llama_test::small_options();
  options.steps = 6;
  options.plan = llama::tp_plan_from_string(c.plan);
  options.sequence_parallel = c.plan == "torchtitan";
  options.loss_parallel = c.plan == "torchtitan";
  options.data_parallel = models::data_parallel_from_string(c.data_parallel);
  const auto meta = llama_test::run_dp_tp(options, c.dp, c.tp, /*capture_grads=*/true, Build::meta_first);
  const auto whole = llama_test::run_dp_tp(options, c.dp, c.tp, /*capture_grads=*/true, Build::whole_then_shard);
  ASSERT_EQ(meta.losses.size(), 6u);
  EXPECT_EQ(meta.losses, whole.losses);
  EXPECT_EQ(meta.param_bytes_per_rank, whole.param_bytes_per_rank);
  ASSERT_EQ(meta.step1_grads.size(), whole.step1_grads.size());
  for (const auto& [name, g] : whole.step1_grads) {
    ASSERT_TRUE(meta.step1_grads.contains(name)) << name;
    EXPECT_TRUE(at::equal(meta.step1_grads.at(name), g))
        << name << ": max |diff| " << (meta.step1_grads.at(name) - g).abs().max().item<double>();
  }
}

INSTANTIATE_TEST_SUITE_P(Parallelisms, BuildModel,
                         testing::Values(Case{1, 1, "ddp", "torchtitan"}, Case{1, 2, "ddp", "torchtitan"},
                                         Case{1, 2, "ddp", "hf"}, Case{2, 2, "ddp", "torchtitan"},
                                         Case{2, 2, "fsdp", "torchtitan"}, Case{2, 1, "fsdp", "torchtitan"}),
                         case_name);

// The sequence-parallel plan's gradient sync hooks (without them each op reading a Partial gradient reduces it
// alone: the same numbers, many more all-reduces) are on the same parameters after build_model as after parallelize.
TEST(BuildModelGradientSync, TheTpPlansHooksMoveToTheMaterializedParameters) {
  auto options = llama_test::small_options();
  options.sequence_parallel = true;
  dtensor::testing::run_ranks(2, [&](int, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    const models::ParallelDims dims = models::ParallelDims::from_mesh(mesh);
    llama::LlamaForCausalLM meta = train::build_model(options, dims);
    llama::LlamaForCausalLM whole = train::make_model(options);
    train::parallelize(whole, options, mesh);
    std::vector<std::string> synced_meta, synced_whole;
    for (const auto& p : meta->named_parameters()) {
      if (dtensor::has_gradient_sync(p.value())) synced_meta.push_back(p.key());
    }
    for (const auto& p : whole->named_parameters()) {
      if (dtensor::has_gradient_sync(p.value())) synced_whole.push_back(p.key());
    }
    EXPECT_FALSE(synced_whole.empty());
    EXPECT_EQ(synced_meta, synced_whole);
  });
}

// At TP 2 a rank allocates its shards and replicas, and at most one whole tensor at a time (the seeded init's full
// value) with the part it cuts from it (measured: 1.5 x the largest tensor over its parameters): never the whole model.
TEST(BuildModelMemory, ARankAllocatesItsShardsAndOneTensorsInitValue) {
  auto options = llama_test::small_options();
  options.model.hidden_size = 128;
  options.model.intermediate_size = 384;
  options.model.num_hidden_layers = 4;
  options.model.vocab_size = 512;
  options.sequence_parallel = true;
  int64_t model_bytes = 0, largest = 0;
  {
    llama::LlamaForCausalLM whole = train::make_model(options);
    for (const auto& p : whole->parameters()) {
      model_bytes += p.numel() * static_cast<int64_t>(p.element_size());
      largest = std::max<int64_t>(largest, p.numel() * static_cast<int64_t>(p.element_size()));
    }
  }
  llama_test::CountingAllocator::install();
  static std::array<llama_test::AllocCounter, 2> counters;  // outlive every tensor they count
  std::array<int64_t, 2> local = {0, 0};
  dtensor::testing::run_ranks(2, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    const models::ParallelDims dims = models::ParallelDims::from_mesh(mesh);
    llama::LlamaForCausalLM model{nullptr};
    {
      llama_test::CountingAllocator::Scope scope(counters[rank]);
      model = train::build_model(options, dims);
    }
    local[rank] = train::local_param_bytes(model);
  });
  for (int r = 0; r < 2; ++r) {
    std::printf("build_model at tp=2 rank %d: peak allocated %lld bytes, its parameters %lld (model %lld, largest tensor %lld)\n",
                r, static_cast<long long>(counters[r].peak), static_cast<long long>(local[r]),
                static_cast<long long>(model_bytes), static_cast<long long>(largest));
    EXPECT_LT(local[r], model_bytes * 6 / 10) << "rank " << r;
    EXPECT_LE(counters[r].peak, local[r] + 2 * largest) << "rank " << r;
  }
}

}  // namespace

// The plan is one value for every entry point (llama/build.h): its names round-trip, an unknown name lists the four,
// and training refuses generation's plans at its options (one ConfigError naming the flag), before any rank builds.
TEST(BuildModelPlan, OneValueNamedAlikeEverywhereAndTrainingRefusesGenerationsPlans) {
  for (llama::TPPlan plan : {llama::TPPlan::torchtitan, llama::TPPlan::hf, llama::TPPlan::inference, llama::TPPlan::ep}) {
    EXPECT_EQ(llama::tp_plan_from_string(llama::to_string(plan)), plan);
  }
  try {
    llama::tp_plan_from_string("megatron");
    ADD_FAILURE() << "no error";
  } catch (const dtensor::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'megatron' (torchtitan, hf, inference or ep)"), std::string::npos) << e.what();
  }
  for (llama::TPPlan plan : {llama::TPPlan::inference, llama::TPPlan::ep}) {
    train::TrainOptions o = llama_test::small_options();
    o.plan = plan;
    try {
      train::resolve_options(o);
      ADD_FAILURE() << "no error for --plan " << llama::to_string(plan);
    } catch (const train::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--plan " + llama::to_string(plan) + " is generation's plan"), std::string::npos)
          << e.what();
    }
  }
}
