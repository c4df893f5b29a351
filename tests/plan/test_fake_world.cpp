// fake_world (dtensor/plan/fake_world.h): one rank of a mesh whose other ranks do not exist; collectives complete at
// once with correctly shaped outputs and are seen by the comm hooks. And DefaultDeviceGuard (nn/default_device.h):
// layers built on the meta device cost no memory.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/mesh/comm_hooks.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/nn/layers.h"
#include "dtensor/plan/fake_world.h"

namespace {

TEST(FakeWorld, RankOfA4x8MeshWithoutPeers) {
  auto world = dtensor::fake_world(32, 13);
  std::vector<int> ranks(32);
  for (int r = 0; r < 32; ++r) ranks[r] = r;
  dtensor::DeviceMesh mesh("cpu", {4, 8}, ranks, {"dp", "tp"}, world);
  EXPECT_EQ(*mesh.get_coordinate(), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(mesh.get_group("tp").ranks(), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(mesh.get_group("dp").ranks(), (std::vector<int>{5, 13, 21, 29}));

  std::vector<std::string> seen;
  dtensor::CommObserverGuard observer([&](const dtensor::CommEvent& e) {
    seen.push_back(std::string(e.collective) + "/" + std::to_string(e.group_size) + "/" + std::to_string(e.bytes));
  });
  at::Tensor x = at::arange(6, at::kFloat).view({2, 3});
  at::Tensor gathered = dtensor::all_gather(x, 0, mesh.get_group("tp"), std::vector<int64_t>(8, 2));
  EXPECT_EQ(gathered.sizes(), (std::vector<int64_t>{16, 3}));
  EXPECT_TRUE(gathered.narrow(0, 10, 2).equal(x));  // every slot holds the local input
  at::Tensor scattered = dtensor::reduce_scatter(at::ones({8, 3}), dtensor::ReduceOp::SUM, 0, mesh.get_group("tp"));
  EXPECT_EQ(scattered.sizes(), (std::vector<int64_t>{1, 3}));
  at::Tensor reduced = dtensor::all_reduce(x, dtensor::ReduceOp::SUM, mesh.get_group("dp"));
  EXPECT_EQ(reduced.sizes(), x.sizes());
  // Meta tensors go through as well: nothing is computed.
  at::Tensor meta = at::empty({4, 1024}, at::TensorOptions().device(at::kMeta));
  EXPECT_EQ(dtensor::all_gather(meta, 1, mesh.get_group("tp"), std::vector<int64_t>(8, 1024)).sizes(), (std::vector<int64_t>{4, 8192}));
  EXPECT_EQ(seen, (std::vector<std::string>{"all_gather/8/24", "reduce_scatter/8/96", "all_reduce/4/24",
                                            "all_gather/8/16384"}));
}

TEST(FakeWorld, BadRankFails) {
  EXPECT_THROW(dtensor::fake_world(4, 4), dtensor::Error);
  EXPECT_THROW(dtensor::fake_world(0, 0), dtensor::Error);
}

TEST(DefaultDeviceGuard, LayersBuiltOnMetaCostNothing) {
  dtensor::nn::Linear big(nullptr);
  dtensor::nn::Embedding table(nullptr);
  dtensor::nn::RMSNorm norm(nullptr);
  {
    dtensor::nn::DefaultDeviceGuard meta(at::kMeta);
    big = dtensor::nn::Linear(torch::nn::LinearOptions(100000, 200000).bias(true));  // 80 GB on the CPU
    table = dtensor::nn::Embedding(1000000, 8192);
    norm = dtensor::nn::RMSNorm(8192);
  }
  EXPECT_FALSE(dtensor::nn::DefaultDeviceGuard::current().has_value());
  EXPECT_TRUE(big->weight.is_meta());
  EXPECT_EQ(big->weight.sizes(), (std::vector<int64_t>{200000, 100000}));
  EXPECT_TRUE(big->weight.requires_grad());
  EXPECT_EQ(big->bias.sizes(), (std::vector<int64_t>{200000}));
  EXPECT_EQ(big->named_parameters()["weight"].sizes(), big->weight.sizes());
  EXPECT_TRUE(table->weight.is_meta());
  EXPECT_EQ(table->weight.sizes(), (std::vector<int64_t>{1000000, 8192}));
  EXPECT_TRUE(norm->weight.is_meta());
  // The forward runs on meta inputs.
  at::Tensor y = big(at::empty({2, 100000}, at::TensorOptions().device(at::kMeta)));
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 200000}));
  // Without the guard: the CPU, as torch::nn's.
  dtensor::nn::Linear small(3, 4);
  EXPECT_EQ(small->weight.device(), at::Device(at::kCPU));
}

}  // namespace
