// Dispatcher behaviour: decision caching, mixed plain tensors, implicit replication, dropout's RNG, the
// fallback's error, custom op registration.
#include <barrier>
#include <gtest/gtest.h>

#include "dtensor/core/error.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "dtensor/ops/sharding_strategy.h"

using namespace dtensor;
using dtensor::testing::run_ranks;
using dtensor::testing::seeded_randn;

TEST(Dispatch, SteadyStateDoesNoStrategySearch) {
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor w = distribute_tensor(seeded_randn(1, {4, 3}), mesh, {Shard(0)}).set_requires_grad(true);
    at::Tensor x = distribute_tensor(seeded_randn(2, {5, 3}), mesh, {Replicate()});
    auto step = [&] {
      at::Tensor loss = at::linear(x, w).relu().sum();
      loss.backward();
    };
    step();
    step();  // the second step also accumulates into existing .grad: a new op
    auto& stats = dispatch_stats();
    int64_t misses = stats.cache_misses, hits = stats.cache_hits;
    for (int i = 0; i < 3; ++i) step();
    EXPECT_EQ(stats.cache_misses, misses) << "a repeated step searched for strategies again";
    EXPECT_GT(stats.cache_hits, hits);
  });
}

TEST(Dispatch, PlainTensorsAreRefusedUnlessScalarOrImplicitlyReplicated) {
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = seeded_randn(3, {4, 3});
    at::Tensor dt = distribute_tensor(full, mesh, {Shard(0)});
    at::Tensor plain = seeded_randn(4, {4, 3});
    try {
      at::mul(dt, plain);
      ADD_FAILURE() << "mixing a plain tensor did not raise";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("mixed plain at::Tensor and DTensor"), std::string::npos) << e.what();
    }
    // A 0-d plain tensor is a replicated scalar.
    EXPECT_TRUE(at::allclose(full_tensor(dt * at::scalar_tensor(2.0)), full * 2.0));
    {
      ImplicitReplicationGuard guard;
      at::Tensor out = at::mul(dt, plain);
      EXPECT_EQ(placements(out), Placements{Shard(0)});
      EXPECT_TRUE(at::allclose(full_tensor(out), full * plain));
    }
  });
}

TEST(Dispatch, DropoutMaskIsConsistentAcrossShardings) {
  // The same seed gives the same dropout result whatever the placements: replicas agree, shards are
  // parts of one global mask.
  std::vector<at::Tensor> results(2);
  run_ranks(4, [&](int rank, int) {
    auto mesh = init_device_mesh("cpu", {4});
    at::Tensor x = at::ones({8, 6});
    manual_seed(7);
    at::Tensor a = full_tensor(at::dropout(distribute_tensor(x, mesh, {Replicate()}), 0.5, true));
    manual_seed(7);
    at::Tensor b = full_tensor(at::dropout(distribute_tensor(x, mesh, {Shard(1)}), 0.5, true));
    EXPECT_TRUE(at::equal(a, b));
    EXPECT_GT((a == 0).sum().item<int64_t>(), 0);
    EXPECT_GT((a == 2).sum().item<int64_t>(), 0);
    // Replicas hold the same mask: rank 0's local equals rank 3's.
    at::Tensor local = to_local(at::dropout(distribute_tensor(x, mesh, {Replicate()}), 0.5, true));
    if (rank == 0) results[0] = local;
    if (rank == 3) results[1] = local;
  });
  EXPECT_TRUE(at::equal(results[0], results[1]));
}

namespace {
// A custom strategy: our own "double the rows" rule for aten::cumsum along dim 1 (shards of dim 0 pass).
ops::ShardingDecision cumsum_rows(const ops::OpCall& call) {
  Placements p = ops::reduce_partials(call.tensors[0].spec->placements);
  for (auto& x : p) {
    if (x.is_shard(1)) x = Replicate();
  }
  return ops::ShardingDecision{{p}, {p}, {}};
}
}  // namespace

TEST(Dispatch, UserRegisteredStrategy) {
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = seeded_randn(5, {4, 6});
    at::Tensor dt = distribute_tensor(full, mesh, {Shard(1)});
    EXPECT_THROW(at::cumsum(dt, 1), std::runtime_error);
  });
  register_sharding("aten::cumsum", &cumsum_rows);
  run_ranks(2, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = seeded_randn(5, {4, 6});
    for (auto p : {Shard(0), Shard(1), Replicate()}) {
      at::Tensor out = at::cumsum(distribute_tensor(full, mesh, {p}), 1);
      EXPECT_TRUE(at::allclose(full_tensor(out), at::cumsum(full, 1)));
    }
  });
}

namespace {
// A second rule for the same op: everything gathered, the output Replicate.
ops::ShardingDecision cumsum_replicated(const ops::OpCall& call) {
  Placements r = ops::replicate_all(call.mesh->ndim());
  return ops::ShardingDecision{{r}, {r}, {}};
}
}  // namespace

TEST(Dispatch, ReplacingARuleAfterFirstUseTakesEffectOnEveryThread) {
  std::barrier sync(2);
  run_ranks(2, [&](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = seeded_randn(5, {4, 6});
    register_sharding("aten::cumprod", &cumsum_rows);  // (cumprod along dim 1 keeps row shards too)
    sync.arrive_and_wait();
    at::Tensor dt = distribute_tensor(full, mesh, {Shard(0)});
    EXPECT_EQ(placements(at::cumprod(dt, 1)), Placements{Shard(0)});  // decided and cached on this thread
    sync.arrive_and_wait();
    if (rank == 0) register_sharding("aten::cumprod", &cumsum_replicated);
    sync.arrive_and_wait();
    at::Tensor out = at::cumprod(dt, 1);
    EXPECT_EQ(placements(out), Placements{Replicate()});  // the new rule, though the old one was cached
    EXPECT_TRUE(at::allclose(full_tensor(out), at::cumprod(full, 1)));
  });
}

TEST(Dispatch, RegisteringARuleForAMisspeltOpFails) {
  std::string err = dtensor::testing::error_of([] { register_sharding("aten::cumsumm", &cumsum_rows); });
  EXPECT_NE(err.find("aten::cumsumm"), std::string::npos) << err;
  EXPECT_NE(err.find("no operator schema"), std::string::npos) << err;
  EXPECT_THROW(register_sharding("aten::cumsum.no_such_overload", &cumsum_rows), dtensor::Error);
  EXPECT_THROW(register_sharding("cumsum", &cumsum_rows), dtensor::Error);
}

TEST(Dispatch, LocalMapRunsOnShards) {
  run_ranks(2, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    at::Tensor full = seeded_randn(6, {4, 3});
    at::Tensor dt = distribute_tensor(full, mesh, {Shard(0)}).set_requires_grad(true);
    // A row-wise op written for plain tensors, run on each shard: rows stay sharded.
    auto fn = [](const std::vector<at::Tensor>& locals) { return locals[0].softmax(1) * 2.0; };
    at::Tensor out = local_map(fn, {dt}, {Placements{Shard(0)}}, Placements{Shard(0)});
    EXPECT_EQ(placements(out), Placements{Shard(0)});
    EXPECT_TRUE(at::allclose(full_tensor(out), full.softmax(1) * 2.0));
    full_tensor(out).sum().backward();
    EXPECT_TRUE(is_dtensor(dt.grad()));
    (void)rank;
  });
}
