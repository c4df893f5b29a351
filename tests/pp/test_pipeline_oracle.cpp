// Our pipeline runtime against PyTorch's torch.distributed.pipelining (tests/oracle/pp_oracle.py: PipelineStage with
// ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B on Gloo, the same stack of Linear + tanh layers, split, schedule
// and microbatches, SGD): the 20 steps' losses, the first step's gradients and the final parameters.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "dtensor/checkpoint/safetensors.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "harness/temp_dir.h"
#include "pp/toy_stack.h"

using dtensor::pp::ScheduleKind;

namespace {

struct Case {
  ScheduleKind kind;
  int pp, v, m;
};

at::Tensor read(const dtensor::checkpoint::SafetensorsFile& f, const std::string& name) {
  const auto* t = f.find(name);
  if (t == nullptr) throw std::runtime_error(f.path() + " has no tensor " + name);
  return f.view(*t).clone();
}

double rel(double a, double b) { return std::abs(a - b) / std::max(1e-12, std::abs(b)); }

}  // namespace

TEST(PipelineOracle, LossesGradientsAndParametersEqualPyTorchsPipelining) {
  // Point-to-point goes through Gloo on either pass, and the toy stack runs no collective: the Gloo pass has nothing
  // to add here.
  if (dtensor::testing::on_gloo_pass()) GTEST_SKIP() << "the same run as the first pass's";
  constexpr int kLayers = 8;
  for (const Case& c : {Case{ScheduleKind::OneFOneB, 2, 1, 4}, Case{ScheduleKind::Interleaved1F1B, 2, 2, 4},
                        Case{ScheduleKind::GPipe, 2, 1, 4}, Case{ScheduleKind::OneFOneB, 4, 1, 8},
                        Case{ScheduleKind::Interleaved1F1B, 2, 2, 6}}) {
    const std::string what = dtensor::pp::to_string(c.kind) + " pp " + std::to_string(c.pp) + " v " +
                             std::to_string(c.v) + " m " + std::to_string(c.m);
    const std::string dir = dtensor::testing::temp_dir("pp_oracle");
    const auto r = dtensor::testing::run_process(
        {DTENSOR_PYTHON, DTENSOR_SOURCE_DIR "/tests/oracle/pp_oracle.py", "--out", dir, "--pp", std::to_string(c.pp),
         "--schedule", dtensor::pp::to_string(c.kind), "--stages-per-rank", std::to_string(c.v), "--microbatches",
         std::to_string(c.m), "--steps", "20", "--layers", std::to_string(kLayers), "--dim", "16", "--batch", "24",
         "--lr", "0.05", "--seed", "3"},
        {{"OMP_NUM_THREADS", "1"}}, 300);
    ASSERT_EQ(r.exit_code, 0) << what << ":\n" << r.output;
    const auto data = dtensor::checkpoint::SafetensorsFile::open(dir + "/data.safetensors");
    const auto result = dtensor::checkpoint::SafetensorsFile::open(dir + "/result.safetensors");
    std::vector<pp_test::Layer> layers;
    for (int i = 0; i < kLayers; ++i) {
      const std::string n = "layers." + std::to_string(i);
      layers.push_back({read(data, n + ".weight").requires_grad_(), read(data, n + ".bias").requires_grad_()});
    }
    const at::Tensor xs = read(data, "inputs"), ys = read(data, "targets");
    const pp_test::Result ours = pp_test::train_pipelined(layers, xs, ys, {c.kind, c.pp, c.v, c.m}, 0.05);
    const at::Tensor theirs = read(result, "losses");
    ASSERT_EQ(static_cast<int64_t>(ours.losses.size()), theirs.numel()) << what;
    for (int64_t i = 0; i < theirs.numel(); ++i) {
      EXPECT_LE(rel(ours.losses[static_cast<size_t>(i)], theirs[i].item<double>()), 1e-6) << what << " step " << i;
    }
    // PyTorch divides the summed gradients by m after the step (scale_grads); we scale each loss by 1/m: equal
    // bits when m is a power of two, fp32 rounding otherwise.
    for (const auto& [name, g] : ours.grads) {
      const at::Tensor t = read(result, "grad." + name);
      EXPECT_LE((g - t).abs().max().item<double>(), 1e-6 * std::max(1.0, t.abs().max().item<double>())) << what << " " << name;
    }
    for (const auto& [name, p] : ours.final_params) {
      const at::Tensor t = read(result, "final." + name);
      EXPECT_LE((p - t).abs().max().item<double>(), 1e-5) << what << " " << name;
    }
  }
}
