// The plan dry run (dtensor/plan/dry_run.h, train/plan_dry_run.h) against real runs: the same
// collectives (type, count, bytes) per phase and the same parameter bytes on every rank as llama_train's
// step with ranks as threads over real process groups; Llama-3-8B's shapes at TP 8 against the analytic
// count; the real run's plan-time error for a TP degree that does not divide the heads.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <mutex>
#include <string>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/plan/dry_run.h"
#include "harness/multi_rank.h"
#include "llama/parallelize.h"
#include "models/llama_test_util.h"
#include "train/loop.h"
#include "train/plan_dry_run.h"

namespace {

using dtensor::StepPhase;

struct RealRank {
  train::StepRecord step;
  int64_t param_bytes = 0;
};

// One llama_train step (no clipping: the dry run has none) on options.dp x tp ranks, every rank's record.
std::map<int, RealRank> real_step(const train::TrainOptions& options, int tp) {
  std::map<int, RealRank> out;
  std::mutex mu;
  dtensor::testing::run_ranks(static_cast<int>(options.dp) * tp, [&](int rank, int world) {
    const dtensor::DeviceMesh mesh = train::parallel_dims(options, world).build_mesh();
    llama::LlamaForCausalLM model = train::make_model(options);
    const models::ParallelDims dims = train::parallelize(model, options, mesh);
    const auto result = train::run(model, options, llama_test::test_corpus(), dims);
    std::lock_guard<std::mutex> lock(mu);
    out[rank] = {result.steps.at(0), result.param_bytes_per_rank};
  });
  return out;
}

// The same through llama_train's own build (train::build_model: LoRA's adapters between the plan and data parallel).
std::map<int, RealRank> real_built_step(const train::TrainOptions& options, int tp) {
  std::map<int, RealRank> out;
  std::mutex mu;
  dtensor::testing::run_ranks(static_cast<int>(options.dp) * tp, [&](int rank, int world) {
    models::ParallelDims dims = train::parallel_dims(options, world);
    dims.build_mesh();
    llama::LlamaForCausalLM model = train::build_model(options, dims);
    const auto result = train::run(model, options, llama_test::test_corpus(), dims);
    std::lock_guard<std::mutex> lock(mu);
    out[rank] = {result.steps.at(0), result.param_bytes_per_rank};
  });
  return out;
}

std::map<std::string, int64_t> plus(std::map<std::string, int64_t> a, const std::map<std::string, int64_t>& b) {
  for (const auto& [k, v] : b) a[k] += v;
  return a;
}

// Every rank simulated.
train::PlanOptions plan_options_of(const train::TrainOptions& o, int tp) {
  train::PlanOptions p = train::plan_options_of(o, tp);
  for (int r = 0; r < o.dp * tp; ++r) p.ranks.push_back(r);
  return p;
}

void expect_dry_run_equals_real_run(train::TrainOptions options, int tp) {
  options.steps = 1;
  options.max_norm = 0;  // no clipping: the dry run's step is forward, backward and AdamW
  const auto real = real_step(options, tp);
  const dtensor::DryRunReport dry = train::dry_run_llama(plan_options_of(options, tp));
  ASSERT_EQ(dry.ranks.size(), static_cast<size_t>(options.dp * tp));
  for (const auto& rank : dry.ranks) {
    SCOPED_TRACE("dp " + std::to_string(options.dp) + " (" + models::to_string(options.data_parallel) + ") tp " + std::to_string(tp) +
                 " rank " + std::to_string(rank.rank));
    const RealRank& r = real.at(rank.rank);
    EXPECT_EQ(plus(rank.counts(StepPhase::FORWARD), rank.counts(StepPhase::BACKWARD)), r.step.fwd_bwd_counts);
    EXPECT_EQ(plus(rank.bytes(StepPhase::FORWARD), rank.bytes(StepPhase::BACKWARD)), r.step.fwd_bwd_bytes);
    EXPECT_EQ(rank.counts(StepPhase::OPTIMIZER), r.step.update_counts);
    EXPECT_EQ(rank.param_bytes, r.param_bytes);
    EXPECT_EQ(rank.grad_bytes, rank.param_bytes);  // gradients take their parameters' placements
    EXPECT_EQ(rank.optimizer_state_bytes, 2 * rank.param_bytes);  // AdamW: exp_avg, exp_avg_sq
    EXPECT_GT(rank.activation_bytes, 0);
    EXPECT_GT(rank.matmul_flops, 0);
  }
  EXPECT_FALSE(dry.ranks.front().counts().empty());
}

// Every op of a step has a meta kernel (LibTorch's or src/ops/meta_kernels.cpp's): the list of the ones
// that do not, for each plan variant, is empty.
TEST(LlamaDryRun, EveryOpOfAStepHasAMetaKernel) {
  for (const bool parallel_extras : {true, false}) {
    for (const int tp : {1, 2}) {
      auto o = llama_test::small_options();
      o.sequence_parallel = o.loss_parallel = parallel_extras;
      const auto p = plan_options_of(o, tp);
      const std::vector<std::string> missing =
          dtensor::find_missing_meta_kernels([&] { train::dry_run_llama(p); });
      std::string list;
      for (const auto& op : missing) list += " " + op;
      EXPECT_TRUE(missing.empty()) << "tp " << tp << (parallel_extras ? " with" : " without")
                                   << " sequence/loss parallel: no meta kernel for" << list;
    }
  }
}

TEST(LlamaDryRun, CollectivesAndParameterBytesEqualARealRunAtTP2) {
  expect_dry_run_equals_real_run(llama_test::small_options(), 2);
}

TEST(LlamaDryRun, CollectivesAndParameterBytesEqualARealRunAtTP4) {
  expect_dry_run_equals_real_run(llama_test::small_options(), 4);  // kv heads replicated (2 heads, TP 4)
}

TEST(LlamaDryRun, WithoutSequenceOrLossParallelEqualsARealRun) {
  auto o = llama_test::small_options();
  o.sequence_parallel = false;
  o.loss_parallel = false;
  expect_dry_run_equals_real_run(o, 2);
}

// Activation checkpointing (--activation-checkpoint): the dry run runs the wrapped blocks as a real run does, so its
// collectives (the recompute's forward ones again in the backward) equal the real run's, and the memory it measures
// is what each mode keeps: activations kept for backward and the peak fall from none to selective (every 2nd of 4
// blocks) to full.
TEST(LlamaDryRun, ActivationCheckpointingEqualsARealRunAndKeepsLessForBackward) {
  auto o = llama_test::small_options();
  o.model.num_hidden_layers = 4;
  o.seq_len = 64;
  std::map<llama::ACMode, dtensor::RankReport> by_mode;
  for (const llama::ACMode mode : {llama::ACMode::none, llama::ACMode::selective, llama::ACMode::full}) {
    o.ac = {.mode = mode, .selective_every = 2};
    if (mode == llama::ACMode::full) expect_dry_run_equals_real_run(o, 2);
    by_mode[mode] = train::dry_run_llama(plan_options_of(o, 2)).ranks.front();
    std::printf("  ac %s: activations kept %lld bytes, peak %lld bytes\n", llama::to_string(mode).c_str(),
                (long long)by_mode[mode].activation_bytes, (long long)by_mode[mode].peak_bytes);
  }
  const auto& none = by_mode[llama::ACMode::none];
  const auto& selective = by_mode[llama::ACMode::selective];
  const auto& full = by_mode[llama::ACMode::full];
  EXPECT_LT(selective.activation_bytes, none.activation_bytes);
  EXPECT_LT(full.activation_bytes, selective.activation_bytes);
  EXPECT_LT(full.peak_bytes, none.peak_bytes);
  EXPECT_GT(full.counts(StepPhase::BACKWARD).at("all_gather"), none.counts(StepPhase::BACKWARD).at("all_gather"));
}

// llama_train's default precision (--mixed-precision bf16): parameters, gradients and AdamW state counted in fp32,
// the activations' collectives in bf16 (half the fp32 bytes), as a real run moves them; FSDP gathers in bf16.
TEST(LlamaDryRun, MixedPrecisionCountsEachTensorInItsDtype) {
  auto o = llama_test::small_options();
  o.mixed_precision = train::MixedPrecision::bf16;
  expect_dry_run_equals_real_run(o, 2);
  o.dp = 2;
  o.data_parallel = models::DataParallel::fsdp;
  expect_dry_run_equals_real_run(o, 2);
  // Against the fp32 plan: the same parameter bytes, every TP all-gather and reduce-scatter half as large.
  auto off = llama_test::small_options();
  auto bf16 = off;
  bf16.mixed_precision = train::MixedPrecision::bf16;
  const dtensor::RankReport a = train::dry_run_llama(plan_options_of(off, 2)).ranks.front();
  const dtensor::RankReport b = train::dry_run_llama(plan_options_of(bf16, 2)).ranks.front();
  EXPECT_EQ(a.param_bytes, b.param_bytes);
  EXPECT_EQ(a.optimizer_state_bytes, b.optimizer_state_bytes);
  for (const char* kind : {"all_gather", "reduce_scatter"}) {
    const auto fp32_bytes = plus(a.bytes(StepPhase::FORWARD), a.bytes(StepPhase::BACKWARD))[kind];
    EXPECT_GT(fp32_bytes, 0) << kind;
    EXPECT_EQ(plus(b.bytes(StepPhase::FORWARD), b.bytes(StepPhase::BACKWARD))[kind] * 2, fp32_bytes) << kind;
  }
  // Pure bf16 (--dtype bfloat16 --mixed-precision off): parameters and optimizer state at half the bytes.
  auto pure = off;
  pure.dtype = "bfloat16";
  const dtensor::RankReport c = train::dry_run_llama(plan_options_of(pure, 2)).ranks.front();
  EXPECT_EQ(c.param_bytes * 2, a.param_bytes);
  EXPECT_EQ(c.optimizer_state_bytes * 2, a.optimizer_state_bytes);
}

// llama_train --float8 (tensorwise: the float8 styles; rowwise: the plain ones): the same collectives and bytes as a
// real run, the block's all-gathers at 1 byte per element, every op with a meta kernel, the float8 matmuls' FLOPs
// counted as the matmuls they replace.
TEST(LlamaDryRun, Float8EqualsARealRun) {
  for (const auto recipe : {dtensor::Float8Recipe::tensorwise, dtensor::Float8Recipe::rowwise}) {
    SCOPED_TRACE(dtensor::to_string(recipe));
    auto o = llama_test::small_options();
    o.float8 = true;
    o.float8_recipe = recipe;
    // Named: auto's first forward would time the kinds and agree on one (all-reduces the dry run does not make).
    o.float8_matmul = dtensor::Float8MatmulKind::emulated;
    const auto p = plan_options_of(o, 2);
    std::string missing;
    for (const auto& op : dtensor::find_missing_meta_kernels([&] { train::dry_run_llama(p); })) missing += " " + op;
    ASSERT_TRUE(missing.empty()) << "no meta kernel for" << missing;
    expect_dry_run_equals_real_run(o, 2);
    auto plain = o;
    plain.float8 = false;
    EXPECT_EQ(train::dry_run_llama(p).ranks.front().matmul_flops,
              train::dry_run_llama(plan_options_of(plain, 2)).ranks.front().matmul_flops);
  }
}

// LoRA (llama_plan --lora-rank ...): the adapters counted as a real LoRA run has them. The same collectives (the
// adapters' gradients reduced, the frozen base's not) and parameter bytes (base and adapters); gradients and AdamW's
// two states for the adapters alone.
TEST(LlamaDryRun, LoraCountsTheAdaptersAsARealRun) {
  auto o = llama_test::small_options();
  o.steps = 1;
  o.max_norm = 0;
  o.lora_rank = 4;
  o.lora_targets = {"q_proj", "v_proj", "down_proj"};
  train::resolve_options(o);
  for (const int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    const auto real = real_built_step(o, tp);
    const dtensor::DryRunReport dry = train::dry_run_llama(plan_options_of(o, tp));
    auto full = o;
    full.lora_rank = 0;
    const dtensor::RankReport base = train::dry_run_llama(plan_options_of(full, tp)).ranks.front();
    for (const auto& rank : dry.ranks) {
      SCOPED_TRACE("rank " + std::to_string(rank.rank));
      const RealRank& r = real.at(rank.rank);
      EXPECT_EQ(plus(rank.counts(StepPhase::FORWARD), rank.counts(StepPhase::BACKWARD)), r.step.fwd_bwd_counts);
      EXPECT_EQ(plus(rank.bytes(StepPhase::FORWARD), rank.bytes(StepPhase::BACKWARD)), r.step.fwd_bwd_bytes);
      EXPECT_EQ(rank.counts(StepPhase::OPTIMIZER), r.step.update_counts);
      EXPECT_EQ(rank.param_bytes, r.param_bytes);
      // The adapters: r x in + out x r per target per layer, fp32, the shards of this rank.
      const int64_t adapters = rank.param_bytes - base.param_bytes;
      EXPECT_GT(adapters, 0);
      EXPECT_EQ(rank.grad_bytes, adapters);
      EXPECT_EQ(rank.optimizer_state_bytes, 2 * adapters);
      EXPECT_LT(rank.optimizer_state_bytes * 20, base.optimizer_state_bytes);
    }
  }
}

// HF's plan (llama_plan --plan hf, a plan search candidate): local activations, the same collectives as a real run.
TEST(LlamaDryRun, HfPlanEqualsARealRun) {
  auto o = llama_test::small_options();
  o.plan = llama::TPPlan::hf;
  o.sequence_parallel = false;
  o.loss_parallel = false;
  expect_dry_run_equals_real_run(o, 2);
}

// Async TP (llama_plan --async-tp): the fused ops counted as the real run counts them, every op with a meta
// kernel, and the same matmul FLOPs and bytes as the synchronous plan (each consumer takes its product from
// the fused op; none computes it again).
TEST(LlamaDryRun, AsyncTPEqualsARealRunAndTheSynchronousPlansWork) {
  auto o = llama_test::small_options();
  o.async_tp = true;
  expect_dry_run_equals_real_run(o, 2);
  const auto async_plan = plan_options_of(o, 2);
  EXPECT_TRUE(dtensor::find_missing_meta_kernels([&] { train::dry_run_llama(async_plan); }).empty());
  const dtensor::RankReport fused = train::dry_run_llama(async_plan).ranks.front();
  o.async_tp = false;
  const dtensor::RankReport plain = train::dry_run_llama(plan_options_of(o, 2)).ranks.front();
  const int64_t layers = o.model.num_hidden_layers;
  auto counts = plus(fused.counts(StepPhase::FORWARD), fused.counts(StepPhase::BACKWARD));
  EXPECT_EQ(counts["fused_all_gather_matmul"], 4 * layers + 1);
  EXPECT_EQ(counts["fused_matmul_reduce_scatter"], 4 * layers + 1);
  EXPECT_EQ(fused.matmul_flops, plain.matmul_flops);
  int64_t fused_bytes = 0, plain_bytes = 0;
  for (const auto& c : fused.comms) fused_bytes += c.bytes;
  for (const auto& c : plain.comms) plain_bytes += c.bytes;
  EXPECT_EQ(fused_bytes, plain_bytes);
  EXPECT_EQ(fused.peak_bytes, plain.peak_bytes);
}

// Data parallel beside TP on a 2x2 ("dp", "tp") mesh, as llama_train plans it: DDP's bucketed gradient
// all-reduces and FSDP's all-gathers and reduce-scatters over dp, counted and sized as the real run's.
TEST(LlamaDryRun, DataParallelTwoByTwoEqualsARealRun) {
  for (const models::DataParallel kind : {models::DataParallel::ddp, models::DataParallel::fsdp}) {
    auto o = llama_test::small_options();
    o.dp = 2;
    o.data_parallel = kind;
    expect_dry_run_equals_real_run(o, 2);
  }
}

// Meta Llama 3 8B (HF config) at TP 8, sequence parallel: one rank of 8 that do not exist, on meta tensors.
TEST(LlamaDryRun, Llama3_8BAtTP8MatchesTheAnalyticCount) {
  train::PlanOptions p;
  auto& c = p.model;
  c.vocab_size = 128256, c.hidden_size = 4096, c.num_hidden_layers = 32, c.num_attention_heads = 32;
  c.num_key_value_heads = 8, c.intermediate_size = 14336, c.max_position_embeddings = 8192;
  p.seq_len = 1024, p.batch = 2, p.tp = 8;
  p.mixed_precision = train::MixedPrecision::off;  // fp32 throughout: 4 bytes an element below
  p.ranks = {0};
  const dtensor::DryRunReport report = train::dry_run_llama(p);
  std::cout << "[ dry run ] Llama-3-8B shapes at TP 8: " << report.seconds << " s\n";
  const auto& rank = report.ranks.at(0);

  // Per layer, forward: sequence parallel gathers the sequence before attention and before the MLP and
  // reduce-scatters after o_proj and down_proj: 2 all-gathers of b·(s/8)·h·4 bytes in (b·s·h·4 out) and
  // 2 reduce-scatters of b·s·h·4 bytes in; the backward mirrors them.
  const int64_t b = p.batch, s = p.seq_len, h = c.hidden_size;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string prefix = "model.layers." + std::to_string(layer) + ".";
    std::map<std::string, std::pair<int64_t, int64_t>> fwd, bwd;  // collective -> (count, bytes)
    for (const auto& r : rank.comms) {
      if (r.module.rfind(prefix, 0) != 0) continue;
      auto& slot = (r.phase == StepPhase::FORWARD ? fwd : bwd)[r.collective];
      slot.first += r.count;
      slot.second += r.bytes;
      EXPECT_EQ(r.mesh_dim, "tp");
      EXPECT_EQ(r.group_size, 8);
    }
    const std::map<std::string, std::pair<int64_t, int64_t>> expected{
        {"all_gather", {2, 2 * b * s * h * 4 / 8}}, {"reduce_scatter", {2, 2 * b * s * h * 4}}};
    EXPECT_EQ(fwd, expected) << "layer " << layer;
    EXPECT_EQ(bwd, expected) << "layer " << layer;
  }

  // Parameters per rank: the sharded weights' eighth, the norms whole (float32).
  const int64_t kv = c.num_key_value_heads * c.head_dim(), f = c.intermediate_size, v = c.vocab_size;
  const int64_t per_layer_sharded = h * h + 2 * h * kv + h * h + 3 * h * f;
  const int64_t sharded = c.num_hidden_layers * per_layer_sharded + 2 * v * h;  // + embeddings, lm_head
  const int64_t replicated = c.num_hidden_layers * 2 * h + h;                     // layer norms, final norm
  EXPECT_EQ(rank.param_bytes, (sharded / 8 + replicated) * 4);
  EXPECT_EQ(rank.num_params, sharded / 8 + replicated);
  EXPECT_EQ(rank.optimizer_state_bytes, 2 * rank.param_bytes);
  EXPECT_GT(rank.activation_bytes, 0);
  EXPECT_GE(rank.peak_bytes, rank.param_bytes + rank.activation_bytes);
}

// A TP degree the heads cannot be split by: the dry run fails at plan time with the real run's error.
TEST(LlamaDryRun, IndivisibleHeadsGiveTheRealRunsPlanTimeError) {
  auto o = llama_test::small_options();
  o.model.num_attention_heads = 6;
  o.model.num_key_value_heads = 3;
  o.model.hidden_size = 48;
  std::string real_error;
  std::mutex mu;
  dtensor::testing::run_ranks(4, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model(o.model);
    const std::string err = dtensor::testing::error_of([&] { llama::apply_tp(model, mesh); });
    std::lock_guard<std::mutex> lock(mu);
    if (rank == 0) real_error = err;
  });
  ASSERT_NE(real_error.find("not divisible by the TP degree 4"), std::string::npos) << real_error;
  const std::string dry_error =
      dtensor::testing::error_of([&] { train::dry_run_llama(plan_options_of(o, 4)); });
  EXPECT_EQ(dry_error, real_error);
}

}  // namespace
