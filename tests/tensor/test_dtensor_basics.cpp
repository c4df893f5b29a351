// A DTensor is an at::Tensor: global sizes, autograd, parameter bookkeeping, and clear errors for ops
// without a sharding rule.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "dtensor/core/error.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::for_each_world;
using dtensor::testing::error_of;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;


TEST(Placement, ReprEqualityHashAndParse) {
  EXPECT_EQ(Shard(1).to_string(), "Shard(dim=1)");
  EXPECT_EQ(Replicate().to_string(), "Replicate()");
  EXPECT_EQ(Partial().to_string(), "Partial(sum)");
  EXPECT_EQ(Partial(ReduceOp::MAX).to_string(), "Partial(max)");
  EXPECT_EQ(Shard(-1).normalized(3), Shard(2));
  EXPECT_THROW(Shard(3).normalized(3), dtensor::Error);
  EXPECT_NE(Shard(0), Shard(1));
  EXPECT_NE(Partial(ReduceOp::SUM), Partial(ReduceOp::AVG));
  EXPECT_EQ(std::hash<Placement>()(Shard(2)), std::hash<Placement>()(Shard(2)));
  EXPECT_NE(std::hash<Placement>()(Shard(2)), std::hash<Placement>()(Shard(1)));
  for (auto p : {Shard(0), Shard(3), Replicate(), Partial(), Partial(ReduceOp::AVG), Partial(ReduceOp::MIN)}) {
    EXPECT_EQ(Placement::parse(p.to_string()), p);
  }
  EXPECT_EQ(Placement::parse("S(1)"), Shard(1));
  EXPECT_THROW(Placement::parse("Shard"), dtensor::Error);
  EXPECT_EQ(to_string({Shard(0), Replicate()}), "[Shard(dim=0), Replicate()]");
}

TEST(DTensorBasics, IsATensorWithGlobalShape) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    at::Tensor full = seeded_randn(1, {6, 5});
    at::Tensor dt = distribute_tensor(full, mesh, {Shard(0)});
    EXPECT_TRUE(is_dtensor(dt));
    EXPECT_EQ(dt.sizes(), full.sizes());
    EXPECT_EQ(dt.scalar_type(), at::kFloat);
    EXPECT_TRUE(dt.device().is_cpu());
    EXPECT_EQ(dt.dim(), 2);
    EXPECT_EQ(dt.numel(), 30);
    auto chunks = full.chunk(world, 0);
    at::Tensor expected = rank < static_cast<int>(chunks.size()) ? chunks[rank] : full.narrow(0, 6, 0);
    EXPECT_TRUE(at::equal(to_local(dt), expected));
    EXPECT_TRUE(at::equal(full_tensor(dt), full));
    EXPECT_EQ(placements(dt), Placements{Shard(0)});
  });
}

TEST(DTensorBasics, ParameterGradAccumulatesAsDTensor) {
  for_each_world({1, 2, 4}, [](int rank, int world) {
    auto mesh = init_device_mesh("cpu", {world});
    at::Tensor full = seeded_randn(2, {8, 3});
    at::Tensor w = distribute_tensor(full, mesh, {Shard(0)}).set_requires_grad(true);
    EXPECT_TRUE(w.is_leaf());
    // loss = sum(w_local * (rank + 1)) summed over ranks, through to_local: grad of w is the weight.
    for (int step = 0; step < 2; ++step) {
      at::Tensor local = to_local(w);
      (local * double(rank + 1)).sum().backward();
    }
    ASSERT_TRUE(w.grad().defined());
    EXPECT_TRUE(is_dtensor(w.grad()));
    EXPECT_EQ(placements(w.grad()), Placements{Shard(0)});
    EXPECT_EQ(w.grad().sizes(), w.sizes());
    EXPECT_TRUE(at::allclose(to_local(w.grad()), at::full(to_local(w).sizes(), 2.0 * (rank + 1))));

    // detach and .data keep the DTensor and share the shard; zero_grad zeroes the DTensor grad.
    at::Tensor d = w.detach();
    EXPECT_TRUE(is_dtensor(d));
    EXPECT_FALSE(d.requires_grad());
    at::Tensor data = w.data();
    EXPECT_TRUE(is_dtensor(data));
    data.zero_();  // in place through .data: the parameter's shard is zero now
    EXPECT_EQ(to_local(w).abs().sum().item<double>(), 0.0);
    w.mutable_grad().zero_();
    EXPECT_TRUE(is_dtensor(w.grad()));
    EXPECT_EQ(to_local(w.grad()).abs().sum().item<double>(), 0.0);
  });
}

TEST(DTensorBasics, GradSeedAndReplicatedLoss) {
  run_ranks(2, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor x = distribute_tensor(seeded_randn(3, {4}), mesh, {Replicate()}).set_requires_grad(true);
    at::Tensor y = x.add(x);  // a DTensor op recorded by autograd
    EXPECT_TRUE(is_dtensor(y));
    EXPECT_NE(y.grad_fn(), nullptr);
    y.backward(at::ones_like(y));  // the seed is a DTensor
    EXPECT_TRUE(is_dtensor(x.grad()));
    EXPECT_TRUE(at::allclose(to_local(x.grad()), at::full({4}, 2.0)));
    (void)rank;
  });
}

TEST(DTensorBasics, FactoryLikesCloneCastFillCopy) {
  run_ranks(4, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2, 2});
    at::Tensor full = seeded_randn(4, {4, 6});
    at::Tensor dt = distribute_tensor(full, mesh, {Shard(0), Shard(1)});
    for (const at::Tensor& t : {at::ones_like(dt), at::zeros_like(dt), at::empty_like(dt), at::full_like(dt, 3.0)}) {
      EXPECT_TRUE(is_dtensor(t));
      EXPECT_EQ(t.sizes(), dt.sizes());
      EXPECT_EQ(placements(t), placements(dt));
    }
    EXPECT_TRUE(at::equal(full_tensor(at::full_like(dt, 3.0)), at::full({4, 6}, 3.0)));
    at::Tensor c = dt.clone();
    EXPECT_TRUE(at::equal(full_tensor(c), full));
    at::Tensor d = dt.to(at::kDouble);
    EXPECT_EQ(d.scalar_type(), at::kDouble);
    EXPECT_EQ(dtensor_spec(d).meta.dtype, at::kDouble);
    EXPECT_TRUE(at::equal(full_tensor(d), full.to(at::kDouble)));

    // Partial: fill_ keeps Partial(sum) semantics; *_like gives Replicate.
    at::Tensor p = DTensor::from_local(at::full({3}, double(rank)), mesh, {Partial(), Partial()});
    EXPECT_TRUE(at::equal(full_tensor(p), at::full({3}, 6.0)));
    EXPECT_EQ(placements(at::zeros_like(p)), (Placements{Replicate(), Replicate()}));
    p.fill_(2.5);
    EXPECT_EQ(placements(p), (Placements{Partial(), Partial()}));
    EXPECT_TRUE(at::equal(full_tensor(p), at::full({3}, 2.5)));

    // copy_ from a DTensor with other placements redistributes; from a plain 0-d tensor fills.
    at::Tensor dst = distribute_tensor(at::zeros({4, 6}), mesh, {Replicate(), Shard(0)});
    dst.copy_(dt);
    EXPECT_EQ(placements(dst), (Placements{Replicate(), Shard(0)}));
    EXPECT_TRUE(at::equal(full_tensor(dst), full));
    dst.copy_(at::scalar_tensor(1.5));
    EXPECT_TRUE(at::equal(full_tensor(dst), at::full({4, 6}, 1.5)));
  });
}

TEST(DTensorBasics, AddRedistributesTheOtherOperand) {
  run_ranks(4, [](int, int) {
    auto mesh = init_device_mesh("cpu", {4});
    at::Tensor a_full = seeded_randn(5, {5, 3}), b_full = seeded_randn(6, {5, 3});
    at::Tensor a = distribute_tensor(a_full, mesh, {Shard(0)});
    at::Tensor b = distribute_tensor(b_full, mesh, {Replicate()});
    at::Tensor s = at::add(a, b, 2.0);
    EXPECT_EQ(placements(s), Placements{Shard(0)});
    EXPECT_TRUE(at::allclose(full_tensor(s), a_full + 2.0 * b_full));
    at::Tensor p = distribute_tensor(a_full, mesh, {Partial()});
    at::Tensor q = distribute_tensor(b_full, mesh, {Partial()});
    EXPECT_EQ(placements(p + q), Placements{Partial()});  // sum of terms is a term of the sum
    EXPECT_TRUE(at::allclose(full_tensor(p + q), a_full + b_full));
    EXPECT_TRUE(at::allclose(full_tensor(p + at::scalar_tensor(1.0)), a_full + 1.0));  // reduced first
    a.add_(b);
    EXPECT_EQ(placements(a), Placements{Shard(0)});
    EXPECT_TRUE(at::allclose(full_tensor(a), a_full + b_full));
  });
}

TEST(DTensorBasics, UnsupportedOpsNameOpAndPlacements) {
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor a = distribute_tensor(seeded_randn(7, {4, 4}), mesh, {Shard(0)});
    at::Tensor b = distribute_tensor(seeded_randn(8, {4, 4}), mesh, {Replicate()});
    std::string e = error_of([&] { at::cumsum(a, 0); });
    EXPECT_NE(e.find("dtensor: aten::cumsum"), std::string::npos) << e;
    EXPECT_NE(e.find("self: [Shard(dim=0)]"), std::string::npos) << e;
    e = error_of([&] { at::cumsum(b, 1); });
    EXPECT_NE(e.find("dtensor: aten::cumsum"), std::string::npos) << e;
    EXPECT_NE(e.find("self: [Replicate()]"), std::string::npos) << e;
    e = error_of([&] { a.add(at::ones({4, 4})); });
    EXPECT_NE(e.find("mixed plain at::Tensor and DTensor"), std::string::npos) << e;
  });
}
