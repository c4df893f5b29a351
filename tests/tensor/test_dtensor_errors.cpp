// Bad input gives a clear error on every rank, at the earliest point, and nobody hangs.
#include <gtest/gtest.h>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using dtensor::testing::run_ranks;

namespace {
void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(DTensorErrors, PlacementsAndShapes) {
  run_ranks(4, [](int, int) {
    auto mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
    at::Tensor x = at::ones({4, 4});
    expect_error([&] { distribute_tensor(x, mesh, {Shard(0)}); }, "1 placements [Shard(dim=0)] for a 2-D mesh");
    expect_error([&] { distribute_tensor(x, mesh, {Shard(2), Replicate()}); },
                 "Shard(dim=2) is out of range for a tensor of 2 dims");
    expect_error([&] { distribute_tensor(at::scalar_tensor(1.0), mesh, {Shard(0), Replicate()}); },
                 "out of range for a tensor of 0 dims");
    expect_error([&] { distribute_tensor(x, mesh, {Partial(ReduceOp::MAX), Partial()}); }, "mixed Partial reduce ops");
    expect_error([&] { distribute_tensor(x, mesh, {Replicate(), Replicate()}, 2); },
                 "src_data_rank 2 is not a rank of mesh dim 0");
    at::Tensor dt = distribute_tensor(x, mesh, {Shard(0), Replicate()});
    expect_error([&] { redistribute(dt, mesh, {Replicate()}); }, "1 placements [Replicate()] for a 2-D mesh");
    expect_error([&] { redistribute(dt, mesh["tp"], {Replicate()}); }, "cross-mesh redistribute is not supported");
    expect_error([&] { to_local(x); }, "to_local expects a DTensor");
    expect_error([&] { DTensor::from_local(at::ones({2}), mesh, {Shard(0), Shard(1)}); },
                 "Shard(dim=1) is out of range for a tensor of 1 dims");
  });
}

TEST(DTensorErrors, FromLocalRunCheckFailsOnEveryRank) {
  auto errors_of = [](const std::function<at::Tensor(int)>& local_of) {
    dtensor::testing::RunOptions options;
    options.expect_all_succeed = false;
    options.collective_timeout = std::chrono::milliseconds(10000);
    return run_ranks(4, [&](int rank, int) {
      auto mesh = init_device_mesh("cpu", {4});
      DTensor::from_local(local_of(rank), mesh, {Shard(0)}, /*run_check=*/true);
    }, options);
  };
  // Rank 2 has one column too many.
  auto errors = errors_of([](int rank) { return at::ones({2, rank == 2 ? 4 : 3}); });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find("from_local: inconsistent local shapes across the mesh: rank 2 has [2, 4]"),
              std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
  // Rank 1 holds doubles.
  errors = errors_of([](int rank) { return at::ones({2, 3}, rank == 1 ? at::kDouble : at::kFloat); });
  for (int r = 0; r < 4; ++r) {
    EXPECT_NE(errors[r].find("local tensors have different dtypes across the mesh"), std::string::npos) << errors[r];
  }
  // Uneven but torch.chunk-consistent shards are fine with run_check: the global shape is inferred exactly.
  run_ranks(4, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {4});
    int64_t rows = std::vector<int64_t>{2, 2, 1, 0}[rank];
    at::Tensor y = DTensor::from_local(at::full({rows, 3}, double(rank)), mesh, {Shard(0)}, true);
    EXPECT_EQ(y.sizes(), (at::IntArrayRef{5, 3}));
  });
}

// DTENSOR_CHECK (dtensor/core/error.h): the message is the pieces as they print, built only when the check fails.
TEST(DTensorErrors, CheckBuildsItsMessageOnlyWhenItFails) {
  int built = 0;
  auto piece = [&] { return ++built; };
  DTENSOR_CHECK(1 + 1 == 2, "never ", piece());
  EXPECT_EQ(built, 0);
  try {
    DTENSOR_CHECK(built > 0, "dtensor: ", int64_t{3}, " heads, ", std::string("tp "), piece(), ' ', at::IntArrayRef{2, 3});
    ADD_FAILURE() << "DTENSOR_CHECK did not throw";
  } catch (const dtensor::Error& e) {
    EXPECT_STREQ(e.what(), "dtensor: 3 heads, tp 1 [2, 3]");
  }
  EXPECT_EQ(built, 1);
  EXPECT_THROW(throw DTENSOR_ERROR("dtensor: ", 1), dtensor::Error);
}
