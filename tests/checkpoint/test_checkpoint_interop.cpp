// Our checkpoints and PyTorch's torch.distributed.checkpoint (HuggingFaceStorageWriter/Reader) read each
// other at any TP degree, bit-identically: saved here at TP 2, loaded by PyTorch at TP 1 and 2 (torchrun,
// Gloo); saved by PyTorch at TP 2, loaded here at TP 1, 2 and 4. tests/oracle/dcp_interop.py is PyTorch's side.
#include <gtest/gtest.h>

#include "checkpoint_test_util.h"
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/checkpoint/safetensors.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "harness/temp_dir.h"

using namespace dtensor;
using namespace dtensor::testing;
namespace ckpt = dtensor::checkpoint;

namespace {

ProcessResult run_pytorch(int nproc, const std::string& mode, const std::string& dir, const std::string& ref) {
  return run_process({DTENSOR_PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", std::to_string(nproc),
                      DTENSOR_SOURCE_DIR "/tests/oracle/dcp_interop.py", mode, dir, ref},
                     // TMPDIR: torchrun's torchelastic_* folders go with the test's own temporary directories
                     {{"OMP_NUM_THREADS", "1"}, {"TMPDIR", temp_dir("torchrun")}}, 240);
}

// A training-like state at TP 2 and its full values.
std::map<std::string, at::Tensor> reference_values() {
  return {{"model.layers.0.self_attn.q_proj.weight", seeded_randn(1, {8, 6})},
          {"model.layers.0.self_attn.o_proj.weight", seeded_randn(2, {6, 8})},
          {"model.norm.weight", seeded_randn(3, {6})},
          {"lm_head.weight", seeded_randn(4, {9, 6}).to(at::kBFloat16)},  // 9 rows: uneven at TP 2
          {"state.model.norm.weight.exp_avg", seeded_randn(5, {6})},
          {"state.model.norm.weight.step", at::scalar_tensor(7.0, at::kFloat)},
          {"train.step", at::scalar_tensor(int64_t{40}, at::kLong)}};
}

}  // namespace

TEST(CheckpointInterop, SavedHereLoadsInPyTorchAtTp1AndTp2) {
  const std::string root = fresh_dir("interop_out");
  const std::string dir = root + "/ckpt", ref = root + "/reference.safetensors";
  const auto values = reference_values();
  run_ranks(2, [&](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    ckpt::StateDict s;
    s["model.layers.0.self_attn.q_proj.weight"] = distribute_tensor(values.at("model.layers.0.self_attn.q_proj.weight"), mesh, {Shard(0)});
    s["model.layers.0.self_attn.o_proj.weight"] = distribute_tensor(values.at("model.layers.0.self_attn.o_proj.weight"), mesh, {Shard(1)});
    s["model.norm.weight"] = distribute_tensor(values.at("model.norm.weight"), mesh, {Replicate()});
    s["lm_head.weight"] = distribute_tensor(values.at("lm_head.weight"), mesh, {Shard(0)});
    s["state.model.norm.weight.exp_avg"] = distribute_tensor(values.at("state.model.norm.weight.exp_avg"), mesh, {Shard(0)});
    s["state.model.norm.weight.step"] = values.at("state.model.norm.weight.step");
    s["train.step"] = values.at("train.step");
    ckpt::save(dir, s);
  });
  std::vector<ckpt::TensorInfo> layout;
  for (const auto& [name, v] : values) layout.push_back({name, v.scalar_type(), v.sizes().vec()});
  ckpt::SafetensorsWriter writer(ref, layout, {});
  for (const auto& [name, v] : values) writer.write(v);
  writer.finish();

  for (int nproc : {1, 2}) {
    const ProcessResult r = run_pytorch(nproc, "load", dir, ref);
    EXPECT_EQ(r.exit_code, 0) << "PyTorch at TP " << nproc << ":\n" << r.output;
    EXPECT_NE(r.output.find("mismatches=0"), std::string::npos) << r.output;
  }
}

TEST(CheckpointInterop, SavedByPyTorchLoadsHereAtTp1Tp2Tp4) {
  const std::string root = fresh_dir("interop_in");
  const std::string dir = root + "/ckpt", ref = root + "/reference.safetensors";
  const ProcessResult r = run_pytorch(2, "save", dir, ref);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto ref_file = ckpt::SafetensorsFile::open(ref);
  for (int world : {1, 2, 4}) {
    run_ranks(world, [&](int, int) {
      auto mesh = init_device_mesh("cpu", {world});
      ckpt::StateDict s;
      int i = 0;
      for (const auto& t : ref_file.tensors()) {
        at::Tensor zeros = at::zeros(t.info.shape, at::TensorOptions().dtype(t.info.dtype));
        const Placements p = (i++ % 2 == 0) ? Placements{Replicate()} : Placements{Shard(0)};
        s[t.info.name] = t.info.shape.empty() ? zeros : distribute_tensor(zeros, mesh, p);
      }
      ckpt::load(dir, s);  // PyTorch writes no index: sizes and headers are checked, there is no checksum
      for (const auto& t : ref_file.tensors()) {
        EXPECT_TRUE(at::equal(full_value(s.at(t.info.name)), ref_file.view(t))) << t.info.name << " at TP " << world;
      }
    });
  }
}
