// The Llama model and llama_train on CUDA tensors: TP 1 on the GPU against the CPU (in process), and TP 2 as
// two real processes sharing the GPU (DTENSOR_CUDA_BACKEND=gloo: NCCL refuses two ranks on one device)
// against TP 1 on the GPU, then its checkpoint resumed on the CPU. Skipped (not passed) where no GPU is usable.
//
// TP > 1 on CUDA is not run with ranks as threads: autograd runs the backward of CUDA tensors on one worker
// thread per device, shared by every thread of the process, so two rank threads' backward collectives would
// wait for each other on that one thread.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "../cuda/cuda_test_util.h"
#include "harness/subprocess.h"
#include "llama_test_util.h"

namespace {

using dtensor::testing::bin_path;
using dtensor::testing::run_process;

train::TrainOptions on_cuda(train::TrainOptions o) {
  o.device = "cuda";
  return o;
}

// llama_train at small_options()'s shapes, as 2 processes under tprun; returns its output.
dtensor::testing::ProcessResult train_tp2_on_gpu(const std::vector<std::string>& extra) {
  const auto o = llama_test::small_options();
  std::vector<std::string> argv = {bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", bin_path("llama_train"),
                                   "--device", "cuda", "--data", DTENSOR_SOURCE_DIR "/README.md",
                                   "--dim", std::to_string(o.model.hidden_size), "--layers", std::to_string(o.model.num_hidden_layers),
                                   "--heads", std::to_string(o.model.num_attention_heads),
                                   "--kv-heads", std::to_string(o.model.num_key_value_heads),
                                   "--ffn-dim", std::to_string(o.model.intermediate_size), "--seq-len", std::to_string(o.seq_len),
                                   "--batch", std::to_string(o.batch), "--max-norm", std::to_string(o.max_norm),
                                   "--lr", std::to_string(o.lr), "--warmup", std::to_string(o.warmup),
                                   "--seed", std::to_string(o.seed), "--log-every", "1"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_process(argv, {{"DTENSOR_CUDA_BACKEND", "gloo"}}, 300);
}

double logged_loss(const std::string& output, int step) {
  char key[32];
  std::snprintf(key, sizeof(key), "step %5d  loss ", step);
  const size_t at = output.rfind(key);
  return at == std::string::npos ? NAN : std::stod(output.substr(at + std::strlen(key)));
}

TEST(LlamaCuda, Tp1OnTheGpuMatchesTheCpu) {
  DTENSOR_REQUIRE_GPU();
  const auto o = llama_test::small_options();
  const auto cpu = llama_test::run_tp(o, 1, /*capture_grads=*/true);
  const auto gpu = llama_test::run_tp(on_cuda(o), 1, true);
  // Different kernels (cuBLAS vs the CPU's), no TF32: fp32 rounding apart over 20 steps.
  EXPECT_LT(llama_test::max_rel_diff(cpu.losses, gpu.losses), 1e-4);
  for (const auto& [name, g] : cpu.step1_grads) {
    EXPECT_TRUE(at::allclose(gpu.step1_grads.at(name), g, 1e-4, 1e-5)) << name;
  }
}

TEST(LlamaCuda, Tp2ProcessesSharingTheGpuMatchTp1ThenResumeOnTheCpu) {
  DTENSOR_REQUIRE_GPU();
  const std::string dir = (std::filesystem::temp_directory_path() / "dtensor_llama_cuda_ckpt").string();
  std::filesystem::remove_all(dir);
  auto o = llama_test::small_options();
  const auto tp1 = llama_test::run_tp(on_cuda(o), 1);
  const auto r = train_tp2_on_gpu({"--steps", std::to_string(o.steps), "--checkpoint-dir", dir, "--checkpoint-every", "10"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("device=cuda:0"), std::string::npos) << r.output;
  for (int step = 1; step <= static_cast<int>(o.steps); ++step) {
    EXPECT_NEAR(logged_loss(r.output, step), tp1.losses[step - 1], 1e-5 * std::abs(tp1.losses[step - 1])) << step;
  }
  // The GPU's step-10 checkpoint (the step-20 one removed), resumed on the CPU at TP 1: steps 11 and 12 follow
  // the GPU run's curve.
  std::filesystem::remove_all(std::filesystem::path(dir) / "step-00000020");
  o.data = DTENSOR_SOURCE_DIR "/README.md";
  o.checkpoint_dir = dir;
  o.resume = true;
  o.stop_after = 12;
  const auto resumed = llama_test::run_tp(o, 1);
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_NEAR(resumed.losses[0], logged_loss(r.output, 11), 1e-4 * resumed.losses[0]);
  EXPECT_NEAR(resumed.losses[1], logged_loss(r.output, 12), 1e-4 * resumed.losses[1]);
  std::filesystem::remove_all(dir);
}

}  // namespace
