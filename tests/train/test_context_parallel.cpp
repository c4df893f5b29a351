// Context parallelism in training (llama_train --cp): the losses and the step-1 gradients of every parameter at
// cp 2 and cp 4, cp 2 x tp 2, cp 2 with the alltoall ring, and cp 2 x dp 2 under FSDP equal one rank's within fp32
// rounding (ranks as threads, the library's training loop); llama_train --cp through tprun logs cp 1's losses, and
// a sequence length the load balancer cannot cut is one error naming the divisor (exit 2); llama_plan --cp's dry run
// counts the real run's collectives and bytes per step. The tiny transformers checkpoints with sliding windows (5 tokens, against
// chunks of 4 at cp 2 and 2 at cp 4) and soft-capping (Gemma 2) fine-tune at cp 2 (and Gemma 2 at cp 4 and cp 2 x tp 2)
// with one rank's losses and step-1 gradients.
#include <gtest/gtest.h>

#include "harness/subprocess.h"
#include "llama/hf_config.h"
#include "models/hf_family_cases.h"
#include "models/llama_test_util.h"

namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).norm().item<double>() / std::max(1e-12, b.norm().item<double>());
}

}  // namespace

TEST(ContextParallel, LossesAndGradientsEqualOneRanks) {
  train::TrainOptions o = llama_test::small_options();
  o.steps = 6;  // seq 16: divisible by tp * 2 * cp up to cp 4 (8) and cp 2 x tp 2 (8)
  const auto ref = llama_test::run_tp(o, 1, /*capture_grads=*/true);
  struct Case {
    const char* label;
    int dp, cp, tp;
    std::string rotate;
    models::DataParallel data_parallel = models::DataParallel::ddp;
  };
  for (const Case& c : {Case{"cp 2", 1, 2, 1, "allgather"}, Case{"cp 4", 1, 4, 1, "allgather"},
                        Case{"cp 2 alltoall", 1, 2, 1, "alltoall"}, Case{"cp 2 x tp 2", 1, 2, 2, "allgather"},
                        Case{"dp 2 x cp 2 fsdp", 2, 2, 1, "alltoall", models::DataParallel::fsdp}}) {
    train::TrainOptions oc = o;
    oc.cp_rotate_method = c.rotate;
    oc.data_parallel = c.data_parallel;
    const auto got = llama_test::run_dp_cp_tp(oc, c.dp, c.cp, c.tp, /*capture_grads=*/true);
    EXPECT_LT(llama_test::max_rel_diff(got.losses, ref.losses), 2e-5) << c.label;
    ASSERT_EQ(got.step1_grads.size(), ref.step1_grads.size()) << c.label;
    for (const auto& [name, g] : ref.step1_grads) {
      EXPECT_LT(rel(got.step1_grads.at(name), g), 2e-5) << c.label << " " << name;
    }
  }
}

TEST(ContextParallel, SlidingWindowAndSoftCappedFamiliesEqualOneRanks) {
  for (const std::string name : {"mistral", "qwen2_sliding", "gemma2", "gemma3", "cohere2"}) {
    train::TrainOptions o = llama_test::small_options();
    o.hf_dir = hf_cases::root() + "/" + name;
    o.model = llama::config_from_hf_json(o.hf_dir + "/config.json");
    o.steps = 3;
    const auto ref = llama_test::run_tp(o, 1, /*capture_grads=*/true);
    std::vector<std::pair<int, int>> runs = {{2, 1}};  // (cp, tp)
    if (name == "gemma2") runs.insert(runs.end(), {{4, 1}, {2, 2}});
    for (const auto& [cp, tp] : runs) {
      const std::string label = name + " cp " + std::to_string(cp) + " tp " + std::to_string(tp);
      const auto got = llama_test::run_dp_cp_tp(o, 1, cp, tp, /*capture_grads=*/true);
      EXPECT_LT(llama_test::max_rel_diff(got.losses, ref.losses), 2e-5) << label;
      ASSERT_EQ(got.step1_grads.size(), ref.step1_grads.size()) << label;
      for (const auto& [param, g] : ref.step1_grads) EXPECT_LT(rel(got.step1_grads.at(param), g), 2e-5) << label << " " << param;
    }
  }
}

TEST(ContextParallel, DryRunCountsTheRealRunsCollectives) {
  auto field = [](const std::string& out, const std::string& key) {
    const size_t at = out.rfind(key + "=");
    return at == std::string::npos ? -1 : std::stoll(out.substr(at + key.size() + 1));
  };
  for (const char* cp : {"2", "4"}) {
    // The same precision on both sides (llama_plan's default is bf16 mixed precision: k and v travel in bf16).
    const auto plan = dtensor::testing::run_process(
        {dtensor::testing::bin_path("llama_plan"), "--cp", cp, "--tp", "1", "--mixed-precision", "off"}, {}, 120);
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    const auto run = dtensor::testing::run_process(
        {dtensor::testing::bin_path("tprun"), "--nproc-per-node", cp, "--master-port", "0",
         dtensor::testing::bin_path("llama_train"), "--cp", cp, "--steps", "2", "--mixed-precision", "off"},
        {{"OMP_NUM_THREADS", "1"}}, 300);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(field(plan.output, "fwd_collectives") + field(plan.output, "bwd_collectives"),
              field(run.output, "collectives_per_step"))
        << plan.output << run.output;
    EXPECT_EQ(field(plan.output, "comm_bytes"), field(run.output, "comm_bytes_per_step")) << plan.output << run.output;
  }
}

TEST(ContextParallel, LlamaTrainCpLogsOneRanksLossesAndRefusesAnUncuttableLength) {
  auto losses = [&](const std::vector<std::string>& extra, int n) {
    std::vector<std::string> argv = {dtensor::testing::bin_path("tprun"), "--nproc-per-node", std::to_string(n), "--master-port", "0",
                                     dtensor::testing::bin_path("llama_train"), "--steps", "3", "--log-every", "1", "--mixed-precision", "off"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto r = dtensor::testing::run_process(argv, {{"OMP_NUM_THREADS", "1"}}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<double> out;
    for (size_t at = r.output.find(" loss "); at != std::string::npos; at = r.output.find(" loss ", at + 1)) {
      out.push_back(std::stod(r.output.substr(at + 6, 10)));
    }
    return out;
  };
  const auto one = losses({}, 1);
  ASSERT_EQ(one.size(), 3u);
  EXPECT_LT(llama_test::max_rel_diff(losses({"--cp", "2", "--cp-rotate-method", "alltoall"}, 2), one), 2e-6);
  const auto bad = dtensor::testing::run_process(
      {dtensor::testing::bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", dtensor::testing::bin_path("llama_train"), "--cp", "2", "--seq-len", "66"},
      {{"OMP_NUM_THREADS", "1"}}, 120);
  EXPECT_NE(bad.output.find("--seq-len 66 is not divisible by 2 * cp = 4"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("exited with status 2"), std::string::npos) << bad.output;
}
