// LoRA (dtensor/peft/lora.h) on a small two-layer MLP, plain and under a TP plan (up Colwise, down Rowwise): the
// adapters' layouts follow their layers' styles, the outputs and every gradient equal the plain model's, the branch adds
// no collective of its own in forward (the Rowwise layer's one reduction sums it), merging gives the same outputs, and
// bad targets are refused by name. PEFT's own numbers are tests/train/lora_peft_test.py's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/debug/comm_debug_mode.h"
#include "dtensor/nn/layers.h"
#include "dtensor/nn/materialize.h"
#include "dtensor/peft/lora.h"
#include "dtensor/tp/parallelize.h"
#include "dtensor/tp/style.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    up = register_module("up", nn::Linear(torch::nn::LinearOptions(8, 16)));
    down = register_module("down", nn::Linear(torch::nn::LinearOptions(16, 8).bias(false)));
    at::NoGradGuard g;
    up->weight.copy_(seeded_randn(1, {16, 8}) * 0.3);
    up->bias.copy_(seeded_randn(2, {16}) * 0.1);
    down->weight.copy_(seeded_randn(3, {8, 16}) * 0.3);
  }
  at::Tensor forward(const at::Tensor& x) { return down(at::gelu(up(x))); }
  nn::Linear up{nullptr}, down{nullptr};
};
TORCH_MODULE(Mlp);

const peft::LoraConfig kConfig{.r = 4, .lora_alpha = 8, .target_modules = {"up", "down"}};

at::Tensor full(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

struct Result {
  at::Tensor out, merged_out;
  std::map<std::string, at::Tensor> grads;  // the adapters', full
  std::map<std::string, std::string> layouts;
  int64_t forward_collectives = -1, trainable = 0;
};

Result run(const DeviceMesh* mesh) {
  Mlp m;
  if (mesh) parallelize_module(*m, *mesh, {{"up", ColwiseParallel()}, {"down", RowwiseParallel()}});
  const auto names = peft::inject_adapter(*m, kConfig, /*seed=*/7);
  EXPECT_EQ(names, (std::vector<std::string>{"up", "down"}));
  Result r;
  r.trainable = peft::mark_only_lora_as_trainable(*m);
  {  // B is zero at init: give it values so that the branch counts.
    at::NoGradGuard g;
    nn::copy_from_full_(m->up->named_parameters()["lora_B.weight"], seeded_randn(8, {16, 4}) * 0.2);
    nn::copy_from_full_(m->down->named_parameters()["lora_B.weight"], seeded_randn(9, {8, 4}) * 0.2);
  }
  for (const auto& p : m->named_parameters()) {
    if (peft::is_lora_parameter(p.key())) r.layouts[p.key()] = is_dtensor(p.value()) ? to_string(placements(p.value())) : "plain";
  }
  const at::Tensor x = seeded_randn(5, {3, 8});
  {
    CommDebugMode comm;
    r.out = full(m(x));
    r.forward_collectives = comm.get_total_counts();
  }
  r.out.pow(2).sum().backward();
  for (const auto& p : m->named_parameters()) {
    if (p.value().grad().defined()) r.grads[p.key()] = full(p.value().grad()).clone();
  }
  peft::merge_adapter(*m);
  r.merged_out = full(m(x)).detach();
  return r;
}

TEST(Lora, TheAdaptersFollowTheirLayersStylesAndGiveThePlainModelsNumbers) {
  const Result plain = run(nullptr);
  EXPECT_EQ(plain.trainable, 4 * 8 + 16 * 4 + 4 * 16 + 8 * 4);
  EXPECT_EQ(plain.grads.size(), 4u);  // the adapters alone: the base is frozen
  EXPECT_TRUE(at::allclose(plain.merged_out, plain.out.detach(), 1e-5, 1e-6));
  run_ranks(2, [&plain](int, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    Result tp = run(&mesh);
    EXPECT_EQ(tp.layouts["up.lora_A.weight"], "[Replicate()]");
    EXPECT_EQ(tp.layouts["up.lora_B.weight"], "[Shard(dim=0)]");
    EXPECT_EQ(tp.layouts["down.lora_A.weight"], "[Shard(dim=1)]");
    EXPECT_EQ(tp.layouts["down.lora_B.weight"], "[Replicate()]");
    // The plan's own: down's Partial -> Replicate all-reduce, and full()'s gather of the output is none (Replicate).
    Mlp bare;
    parallelize_module(*bare, mesh, {{"up", ColwiseParallel()}, {"down", RowwiseParallel()}});
    int64_t bare_collectives = 0;
    {
      CommDebugMode comm;
      full(bare(seeded_randn(5, {3, 8})));
      bare_collectives = comm.get_total_counts();
    }
    EXPECT_EQ(tp.forward_collectives, bare_collectives);
    EXPECT_TRUE(at::allclose(tp.out, plain.out, 1e-5, 1e-6));
    ASSERT_EQ(tp.grads.size(), plain.grads.size());
    for (const auto& [k, g] : plain.grads) EXPECT_TRUE(at::allclose(tp.grads.at(k), g, 1e-5, 1e-6)) << k;
    EXPECT_TRUE(at::allclose(tp.merged_out, plain.merged_out, 1e-5, 1e-6));
  });
}

TEST(Lora, DisablingTheAdapterGivesTheBaseModel) {
  Mlp base, adapted;
  peft::inject_adapter(*adapted, kConfig);
  const at::Tensor x = seeded_randn(5, {3, 8});
  EXPECT_TRUE(at::equal(adapted(x), base(x)));  // B = 0 at init (PEFT's): the branch adds exactly 0
  {
    at::NoGradGuard g;
    adapted->up->named_parameters()["lora_B.weight"].fill_(0.5);
  }
  EXPECT_FALSE(at::allclose(adapted(x), base(x)));
  peft::set_adapter_enabled(*adapted, false);
  EXPECT_TRUE(at::equal(adapted(x), base(x)));
}

TEST(Lora, BadTargetsAreRefusedByName) {
  Mlp m;
  auto message = [&](const peft::LoraConfig& c) {
    try {
      peft::inject_adapter(*m, c);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({.r = 4, .target_modules = {"up", "nope"}}).find("target module 'nope' not found"), std::string::npos);
  EXPECT_NE(message({.r = 0, .target_modules = {"up"}}).find("r (the rank) must be >= 1"), std::string::npos);
  EXPECT_FALSE(peft::has_adapter(*m->up));  // nothing changed by a refused config
  run_ranks(2, [](int, int world) {
    const DeviceMesh mesh = init_device_mesh("cpu", {world});
    Mlp tp;
    parallelize_module(*tp, mesh, {{"up", ColwiseParallel()}});
    try {
      peft::inject_adapter(*tp, {.r = 4, .target_modules = {"up"}, .lora_dropout = 0.1});
      ADD_FAILURE() << "dropout under TP was accepted";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("lora_dropout 0.1 on 'up' under TP"), std::string::npos) << e.what();
    }
  });
}

}  // namespace
