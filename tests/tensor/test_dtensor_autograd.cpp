// Gradients of redistribute, to_local, from_local and full_tensor against single-process autograd.
#include <gtest/gtest.h>

#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

TEST(DTensorAutograd, RedistributeThenFullTensorMatchesSingleProcess) {
  run_ranks(4, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2, 2});
    const std::vector<Placements> layouts{
        {Shard(0), Shard(1)}, {Shard(1), Replicate()}, {Replicate(), Replicate()}, {Partial(), Shard(0)},
        {Shard(0), Shard(0)}, {Replicate(), Partial()}, {Shard(1), Shard(0)}};
    at::Tensor X = seeded_randn(1, {5, 6});
    at::Tensor W = seeded_randn(2, {5, 6});
    // Reference: L = sum(X^2 * W), dL/dX = 2 X W.
    at::Tensor Xr = X.clone().set_requires_grad(true);
    (Xr.pow(2) * W).sum().backward();
    for (const auto& src : layouts) {
      for (const auto& dst : layouts) {
        SCOPED_TRACE(to_string(src) + " -> " + to_string(dst));
        at::Tensor x = distribute_tensor(X, mesh, src).set_requires_grad(true);
        at::Tensor full = full_tensor(redistribute(x, mesh, dst));
        (full.pow(2) * W).sum().backward();
        ASSERT_TRUE(is_dtensor(x.grad()));
        // The gradient comes back on the source placements (Partial ones as Replicate, as PyTorch).
        Placements expected = src;
        for (auto& p : expected) {
          if (p.is_partial()) p = Replicate();
        }
        EXPECT_EQ(placements(x.grad()), expected);
        EXPECT_TRUE(at::allclose(full_tensor(x.grad()), Xr.grad(), 1e-5, 1e-6));
      }
    }
  });
}

TEST(DTensorAutograd, ToLocalGradientIsEachRanksOwn) {
  run_ranks(4, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {4});
    at::Tensor x = distribute_tensor(seeded_randn(3, {7, 2}), mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor local = to_local(x);
    at::Tensor w = seeded_randn(10 + rank, local.sizes());
    (local * w).sum().backward();
    EXPECT_EQ(placements(x.grad()), Placements{Shard(0)});
    EXPECT_TRUE(at::equal(to_local(x.grad()), w));
    // grad_placements override: each rank's local gradient is declared a Partial term, and the leaf's
    // .grad keeps it so (as PyTorch); its value is the sum 0 + 1 + 2 + 3.
    at::Tensor y = distribute_tensor(seeded_randn(4, {3}), mesh, {Replicate()}).set_requires_grad(true);
    (to_local(y, Placements{Partial()}) * double(rank)).sum().backward();
    EXPECT_EQ(placements(y.grad()), Placements{Partial()});
    EXPECT_TRUE(at::allclose(full_tensor(y.grad()), at::full({3}, 6.0)));
  });
}

TEST(DTensorAutograd, FromLocalGradientFlowsToTheLocalTensor) {
  run_ranks(4, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {4});
    at::Tensor W = seeded_randn(5, {8, 3});
    // Shard(0): each local gets its rows of W.
    at::Tensor l = seeded_randn(20 + rank, {2, 3}).set_requires_grad(true);
    at::Tensor y = DTensor::from_local(l, mesh, {Shard(0)});
    (full_tensor(y) * W).sum().backward();
    EXPECT_TRUE(at::equal(l.grad(), W.narrow(0, 2 * rank, 2)));
    // Partial: the value is the sum of the locals, so every local gets all of W.
    at::Tensor p = seeded_randn(30 + rank, {8, 3}).set_requires_grad(true);
    at::Tensor z = DTensor::from_local(p, mesh, {Partial()});
    at::Tensor zfull = full_tensor(z);
    at::Tensor expected_value = seeded_randn(30, {8, 3}) + seeded_randn(31, {8, 3}) + seeded_randn(32, {8, 3}) +
                                seeded_randn(33, {8, 3});
    EXPECT_TRUE(at::allclose(zfull, expected_value, 1e-5, 1e-6));
    (zfull * W).sum().backward();
    EXPECT_TRUE(at::equal(p.grad(), W));
  });
}

TEST(DTensorAutograd, UnevenShardsAllTheWay) {
  run_ranks(4, [](int, int) {
    auto mesh = init_device_mesh("cpu", {4});
    at::Tensor X = seeded_randn(6, {5, 3});  // rows 2, 2, 1, 0
    at::Tensor W = seeded_randn(7, {5, 3});
    at::Tensor x = distribute_tensor(X, mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor moved = redistribute(redistribute(x, mesh, {Shard(1)}), mesh, {Replicate()});
    (to_local(moved) * W).sum().backward();
    EXPECT_EQ(placements(x.grad()), Placements{Shard(0)});
    EXPECT_TRUE(at::equal(full_tensor(x.grad()), W));
  });
}
