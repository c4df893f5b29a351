// Checkpoints of llama_train: a run stopped at step 6 and resumed at TP 2, 1 and 4 continues with the losses of
// the uninterrupted TP 2 run (<= 1e-5 relative: model, AdamW state and data position all restored); the AdamW
// state round-trips across TP degrees; loading at TP 2 allocates at most about half the model per rank.
#include <gtest/gtest.h>

#include <signal.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <thread>

#include "models/alloc_counter.h"
#include "train/checkpointing.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/state_dict.h"
#include "dtensor/checkpoint/step_checkpoints.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "models/llama_test_util.h"
#include "harness/temp_dir.h"

namespace fs = std::filesystem;
namespace ckpt = dtensor::checkpoint;
using llama_test::max_rel_diff;
using llama_test::run_tp;

namespace {

std::string fresh(const std::string& tag) {
  return dtensor::testing::temp_dir("llama_ckpt_" + tag);
}

train::TrainOptions twelve_steps() {
  auto o = llama_test::small_options();
  o.steps = 12;
  return o;
}

}  // namespace

TEST(LlamaCheckpoint, ResumedRunHasTheUninterruptedLossesAtAnyTp) {
  const auto options = twelve_steps();
  const auto uninterrupted = run_tp(options, 2);
  ASSERT_EQ(uninterrupted.losses.size(), 12u);

  const std::string dir = fresh("resume");
  auto first = options;
  first.checkpoint_dir = dir;
  first.checkpoint_every = 3;
  first.stop_after = 6;  // "killed" after step 6
  const auto before = run_tp(first, 2);
  ASSERT_EQ(before.losses.size(), 6u);
  EXPECT_TRUE(ckpt::is_checkpoint(ckpt::step_checkpoint_path(dir, 3)));
  EXPECT_TRUE(ckpt::is_checkpoint(ckpt::step_checkpoint_path(dir, 6)));
  ASSERT_EQ(ckpt::latest_step_checkpoint(dir)->step, 6);

  const std::vector<double> rest(uninterrupted.losses.begin() + 6, uninterrupted.losses.end());
  for (int tp : {2, 1, 4}) {
    auto resumed = options;
    resumed.checkpoint_dir = dir;
    resumed.resume = true;
    const auto after = run_tp(resumed, tp);
    ASSERT_EQ(after.steps.size(), 6u) << "TP " << tp;
    EXPECT_EQ(after.steps.front().step, 6);
    const double rel = max_rel_diff(rest, after.losses);
    std::printf("resume at tp=%d: max relative loss difference %.3e over steps 7-12\n", tp, rel);
    EXPECT_LE(rel, 1e-5) << "TP " << tp;
  }
}

// Saved under DDP x TP (each dp replica holds the same TP shards: one of them writes each chunk, as DCP's
// dedup_save_plans; the load found every chunk twice before), resumed at DP 2 x TP 2 and at TP 2 alone.
TEST(LlamaCheckpoint, SavedUnderDdpTimesTpResumesWithTheUninterruptedLosses) {
  auto options = twelve_steps();
  const auto uninterrupted = llama_test::run_dp_tp(options, 2, 2);
  const std::string dir = fresh("resume_ddp");
  auto first = options;
  first.checkpoint_dir = dir;
  first.checkpoint_every = 6;
  first.stop_after = 6;
  ASSERT_EQ(llama_test::run_dp_tp(first, 2, 2).losses.size(), 6u);
  const std::vector<double> rest(uninterrupted.losses.begin() + 6, uninterrupted.losses.end());
  auto resumed = options;
  resumed.checkpoint_dir = dir;
  resumed.resume = true;
  EXPECT_LE(max_rel_diff(rest, llama_test::run_dp_tp(resumed, 2, 2).losses), 1e-5) << "DP 2 x TP 2";
  EXPECT_LE(max_rel_diff(rest, run_tp(resumed, 2).losses), 1e-5) << "TP 2";
}

// Across precisions: a mixed-precision run (fp32 masters and AdamW state, bf16 compute) saved at TP 2 resumes in mixed
// precision bit for bit (the masters are what it saved), in fp32 (--mixed-precision off) and as pure bf16 parameters
// (--dtype bfloat16 --mixed-precision off: the masters and AdamW state converted on load) close to the uninterrupted run.
TEST(LlamaCheckpoint, MixedPrecisionCheckpointResumesInEachPrecision) {
  auto options = twelve_steps();
  options.mixed_precision = train::MixedPrecision::bf16;
  const auto uninterrupted = run_tp(options, 2);
  const std::string dir = fresh("precision");
  auto first = options;
  first.checkpoint_dir = dir;
  first.checkpoint_every = 6;
  first.stop_after = 6;
  ASSERT_EQ(run_tp(first, 2).losses.size(), 6u);
  const std::vector<double> rest(uninterrupted.losses.begin() + 6, uninterrupted.losses.end());
  auto resumed = options;
  resumed.checkpoint_dir = dir;
  resumed.resume = true;
  EXPECT_EQ(run_tp(resumed, 2).losses, rest);
  auto fp32 = resumed;
  fp32.mixed_precision = train::MixedPrecision::off;
  auto bf16 = fp32;
  bf16.dtype = "bfloat16";
  for (const auto& [name, o] : {std::pair{"fp32", fp32}, {"pure bf16", bf16}}) {
    const auto after = run_tp(o, 2);
    ASSERT_EQ(after.steps.size(), 6u) << name;
    EXPECT_EQ(after.steps.front().step, 6) << name;
    const double rel = max_rel_diff(rest, after.losses);
    std::printf("mixed-precision checkpoint resumed in %s: max relative loss difference %.3e over steps 7-12\n", name, rel);
    EXPECT_LE(rel, 1e-2) << name;  // measured 2.9e-4 (fp32) and 1.7e-3 (pure bf16); deterministic
  }
}

TEST(LlamaCheckpoint, AdamWStateRoundTripsAcrossTpDegrees) {
  auto options = twelve_steps();
  options.steps = 3;
  const std::string dir = fresh("adamw");
  options.checkpoint_dir = dir;
  options.checkpoint_every = 3;
  run_tp(options, 2);
  const std::string path = ckpt::step_checkpoint_path(dir, 3);
  // Full values as saved, from a TP 1 load; then a TP 4 load must hold the same values.
  std::map<std::string, at::Tensor> at_tp1;
  std::mutex mu;
  for (int tp : {1, 4}) {
    dtensor::testing::run_ranks(tp, [&](int rank, int world) {
      auto mesh = dtensor::init_device_mesh("cpu", {world});
      llama::LlamaForCausalLM model = train::make_model(options);
      train::parallelize(model, options, mesh);
      std::vector<at::Tensor> params;
      for (const auto& p : model->parameters()) params.push_back(p);
      torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-3));
      ckpt::StateDict state = ckpt::module_state_dict(*model);
      for (auto& [k, v] : ckpt::adamw_state_dict(optimizer, *model)) state[k] = v;
      ckpt::load(path, state, {.allow_unused = true});  // train.* not wanted here
      ckpt::set_adamw_steps(optimizer, *model, state);
      for (const auto& p : params) {
        EXPECT_EQ(static_cast<torch::optim::AdamWParamState&>(*optimizer.state().at(p.unsafeGetTensorImpl())).step(), 3);
      }
      std::map<std::string, at::Tensor> full;
      for (const auto& [k, v] : state) full[k] = dtensor::is_dtensor(v) ? dtensor::full_tensor(v) : v.clone();
      if (rank != 0) return;
      std::lock_guard<std::mutex> lock(mu);
      if (tp == 1) {
        at_tp1 = full;
        return;
      }
      for (const auto& [k, v] : at_tp1) EXPECT_TRUE(at::equal(full.at(k), v)) << k;
      EXPECT_GT(at_tp1.at("state.model.norm.weight.exp_avg_sq").abs().sum().item<double>(), 0);
    });
  }
}

TEST(LlamaCheckpoint, LoadingAtTp2AllocatesAboutHalfTheModelPerRank) {
  auto options = twelve_steps();
  options.model.hidden_size = 128;
  options.model.intermediate_size = 384;
  options.model.num_hidden_layers = 3;
  const std::string dir = fresh("memory") + "/ckpt";
  int64_t model_bytes = 0, largest = 0;
  {
    llama::LlamaForCausalLM model = train::make_model(options);
    ckpt::StateDict state = ckpt::module_state_dict(*model);
    for (const auto& [_, t] : state) {
      model_bytes += t.numel() * static_cast<int64_t>(t.element_size());
      largest = std::max<int64_t>(largest, t.numel() * static_cast<int64_t>(t.element_size()));
    }
    ckpt::save(dir, state);  // one process, no world: the whole model in rank 0's file
  }
  auto& allocator = llama_test::CountingAllocator::install();
  (void)allocator;
  static std::array<llama_test::AllocCounter, 2> counters;  // outlive every tensor they count
  dtensor::testing::run_ranks(2, [&](int rank, int world) {
    auto mesh = dtensor::init_device_mesh("cpu", {world});
    llama::LlamaForCausalLM model(options.model);  // random weights, parallelized, then loaded
    train::parallelize(model, options, mesh);
    ckpt::StateDict state = ckpt::module_state_dict(*model);
    {
      llama_test::CountingAllocator::Scope scope(counters[rank]);
      ckpt::load(dir, state);
    }
  });
  for (int r = 0; r < 2; ++r) {
    std::printf("load at tp=2 rank %d: peak allocated %lld bytes (model %lld, half %lld, largest tensor %lld)\n", r,
                static_cast<long long>(counters[r].peak), static_cast<long long>(model_bytes),
                static_cast<long long>(model_bytes / 2), static_cast<long long>(largest));
    EXPECT_LE(counters[r].peak, model_bytes / 2 + largest) << "rank " << r;
  }
}

namespace {

// The last "step N  loss X" line for step `step` in llama_train's output; NaN if absent.
double loss_at(const std::string& output, int step) {
  char key[32];
  std::snprintf(key, sizeof(key), "step %5d  loss ", step);
  const size_t at = output.rfind(key);
  return at == std::string::npos ? NAN : std::stod(output.substr(at + std::strlen(key)));
}

dtensor::testing::ProcessResult run_llama_train(const std::vector<std::string>& extra,
                                                const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv = {dtensor::testing::bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0",
                                   dtensor::testing::bin_path("llama_train"), "--dim", "64", "--layers", "2", "--heads", "4",
                                   "--kv-heads", "2", "--ffn-dim", "128", "--seq-len", "16", "--batch", "4", "--steps", "8",
                                   "--log-every", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return dtensor::testing::run_process(argv, env, 300);
}

}  // namespace

// Preemption (torchtitan's, TorchElastic's): SIGTERM to tprun, forwarded to every rank, during training. Every rank
// stops at the same step boundary (the flag is all-reduced), the checkpoint of that step is saved, the ranks exit 0;
// --resume continues with the uninterrupted run's losses, bit for bit.
TEST(LlamaCheckpoint, SigtermSavesAtTheNextStepBoundaryAndResumes) {
  using dtensor::testing::bin_path;
  const std::string dir = fresh("preempt") + "/ck";
  const std::vector<std::string> train = {bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0",
                                          "--grace-seconds", "60", bin_path("llama_train"), "--dim", "64", "--layers",
                                          "2", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--seq-len", "16",
                                          "--batch", "4", "--steps", "5000", "--log-every", "1", "--checkpoint-dir", dir};
  const std::string log = fresh("preempt_log") + "/out.txt";
  const int pid = dtensor::testing::start_process(train, {}, log);
  // Bounded: until step 10 is logged (at most 120 s), then SIGTERM.
  bool started = false;
  for (int i = 0; i < 1200 && !started; ++i) {
    std::ifstream in(log);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    started = text.find("step    10  loss") != std::string::npos;
    if (!started) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(::kill(pid, SIGTERM), 0);
  const auto stopped = dtensor::testing::wait_process(pid, log, 120);
  ASSERT_TRUE(started) << stopped.output;
  EXPECT_EQ(stopped.exit_code, 0) << stopped.output;  // the ranks saved and exited 0: so does tprun (the README's word)
  EXPECT_NE(stopped.output.find("preempted=1"), std::string::npos) << stopped.output;
  const auto latest = ckpt::latest_step_checkpoint(dir);
  ASSERT_TRUE(latest.has_value()) << stopped.output;
  const int64_t at = latest->step;
  EXPECT_GE(at, 10);
  EXPECT_LT(at, 5000);
  EXPECT_NE(stopped.output.find("preempted (SIGTERM) after step " + std::to_string(at) + ": checkpoint"), std::string::npos)
      << stopped.output;

  auto until = [&](std::vector<std::string> argv, std::vector<std::string> extra) {
    argv.insert(argv.end(), extra.begin(), extra.end());
    return dtensor::testing::run_process(argv, {}, 300);
  };
  const std::string stop_after = std::to_string(at + 3);
  auto uninterrupted_argv = train;
  uninterrupted_argv.back() = fresh("preempt_ref");  // its own --checkpoint-dir
  const auto uninterrupted = until(uninterrupted_argv, {"--stop-after", stop_after});
  const auto resumed = until(train, {"--resume", "--stop-after", stop_after});
  ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed_from=" + std::to_string(at)), std::string::npos) << resumed.output;
  for (int64_t step = at + 1; step <= at + 3; ++step) {
    EXPECT_EQ(loss_at(resumed.output, static_cast<int>(step)), loss_at(uninterrupted.output, static_cast<int>(step)))
        << "step " << step;
  }
}

// Real processes: a rank killed (SIGKILL) while saving step 8 leaves step 4 whole and loadable, and the killed save
// at most as a ".partial" staging directory nobody takes for a checkpoint; --resume continues from step 4,
// reaches the same step-8 loss, and its save replaces the leftover.
// Whether the .partial is left is a race that both outcomes of are right: rank 0 removes it when its next
// collective fails, unless tprun (which ends the survivors once a rank dies, as torchrun does) ends rank 0 first.
// Idle, tprun mostly wins; under load rank 0 sometimes does (scripts/flake_check.sh 20: once in 20 Gloo runs). So the test
// checks what is guaranteed either way, and when rank 0 did clean up, it plants the leftover a killed rank 0
// would have left (shard files, no index), so the resumed save always meets one.
TEST(LlamaCheckpoint, RankKilledDuringSaveLeavesThePreviousCheckpoint) {
  const std::string dir = fresh("killed") + "/ck";
  auto first = run_llama_train({"--checkpoint-dir", dir, "--checkpoint-every", "4", "--stop-after", "4"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto killed = run_llama_train({"--checkpoint-dir", dir, "--checkpoint-every", "4", "--resume"},
                                {{"DTENSOR_CHECKPOINT_KILL_RANK", "1"}});
  EXPECT_NE(killed.exit_code, 0) << killed.output;
  const double loss8 = loss_at(killed.output, 8);
  ASSERT_FALSE(std::isnan(loss8)) << killed.output;

  EXPECT_TRUE(ckpt::is_checkpoint(ckpt::step_checkpoint_path(dir, 4)));
  EXPECT_FALSE(ckpt::is_checkpoint(ckpt::step_checkpoint_path(dir, 8)));
  const std::string partial = dir + "/.step-00000008.partial";
  EXPECT_FALSE(fs::exists(partial + "/model.safetensors.index.json"));  // the index is written last, by rank 0
  if (!fs::exists(partial)) {  // rank 0 removed it before tprun ended it: leave what a killed rank 0 leaves
    fs::create_directories(partial);
    const fs::path step4(ckpt::step_checkpoint_path(dir, 4));
    for (const auto& entry : fs::directory_iterator(step4)) {
      if (entry.path().filename() != "model.safetensors.index.json") fs::copy(entry.path(), fs::path(partial) / entry.path().filename());
    }
  }
  EXPECT_FALSE(ckpt::is_checkpoint(partial));
  ASSERT_EQ(ckpt::latest_step_checkpoint(dir)->step, 4);

  auto resumed = run_llama_train({"--checkpoint-dir", dir, "--checkpoint-every", "4", "--resume"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed_from=4"), std::string::npos) << resumed.output;
  EXPECT_EQ(loss_at(resumed.output, 8), loss8);
  EXPECT_TRUE(ckpt::is_checkpoint(ckpt::step_checkpoint_path(dir, 8)));
  EXPECT_FALSE(fs::exists(dir + "/.step-00000008.partial"));
}
