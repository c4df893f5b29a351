// Ranks that disagree on a collective's sizes (one passes batch 4, the other batch 3): every rank ends with a
// dtensor::Error naming the collective, the group and each rank's sizes — never gloo's terminate(), never a
// hang (size_agreement.h).
#include <gtest/gtest.h>

#include <functional>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/api/dtensor_api.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Runs `body(rank, mesh)` on 2 thread ranks and checks that both fail naming `collective`, the group and
// the two shapes.
void expect_every_rank_fails(const std::string& collective, const std::string& shape0, const std::string& shape1,
                             const std::function<void(int, const DeviceMesh&)>& body) {
  RunOptions options;
  options.collective_timeout = std::chrono::milliseconds(20000);
  options.run_timeout = std::chrono::milliseconds(60000);
  options.expect_all_succeed = false;
  auto errors = run_ranks(2, [&](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    body(rank, mesh);
  }, options);
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[r];
    EXPECT_TRUE(contains(e, "dtensor: " + collective + " on group [0, 1] (rank " + std::to_string(r) + " of 2)"))
        << "rank " << r << ": " << e;
    EXPECT_TRUE(contains(e, "rank 0 (group rank 0): " + collective + " of a Float tensor " + shape0)) << e;
    EXPECT_TRUE(contains(e, "rank 1 (group rank 1): " + collective + " of a Float tensor " + shape1)) << e;
  }
}

int64_t batch(int rank) { return rank == 0 ? 4 : 3; }

}  // namespace

TEST(SizeMismatch, AllReduce) {
  expect_every_rank_fails("all_reduce", "[4, 8]", "[3, 8]", [](int rank, const DeviceMesh& mesh) {
    all_reduce(at::ones({batch(rank), 8}), ReduceOp::SUM, mesh, 0);
  });
}

TEST(SizeMismatch, AllGatherOnAnotherDim) {
  // Gathering dim 1 (equal on both ranks) of tensors whose batch differs (the gathered dim moves to the
  // front of the buffer that the message shows).
  expect_every_rank_fails("all_gather", "[2, 4]", "[2, 3]", [](int rank, const DeviceMesh& mesh) {
    all_gather(at::ones({batch(rank), 2}), 1, mesh, 0);
  });
}

TEST(SizeMismatch, ReduceScatter) {
  expect_every_rank_fails("reduce_scatter", "[", "[", [](int rank, const DeviceMesh& mesh) {
    reduce_scatter(at::ones({4, batch(rank)}), ReduceOp::SUM, 0, mesh, 0);
  });
}

TEST(SizeMismatch, AllToAll) {
  expect_every_rank_fails("all_to_all", "[", "[", [](int rank, const DeviceMesh& mesh) {
    all_to_all(at::ones({4, 2, batch(rank)}), 0, 1, mesh, 0);
  });
}

TEST(SizeMismatch, Broadcast) {
  expect_every_rank_fails("broadcast", "[4, 8]", "[3, 8]", [](int rank, const DeviceMesh& mesh) {
    broadcast(at::ones({batch(rank), 8}), 0, mesh, 0);
  });
}

TEST(SizeMismatch, SequenceParallelInputWithDifferentBatch) {
  // A sequence-sharded activation made from each rank's local input (as PrepareModuleInput does) whose
  // batch differs: Shard(1) -> Replicate is an all-gather of mismatched pieces.
  expect_every_rank_fails("all_gather", "[", "[", [](int rank, const DeviceMesh& mesh) {
    at::Tensor x = DTensor::from_local(at::ones({batch(rank), 2, 4}), mesh, {Shard(1)});
    redistribute(x, mesh, {Replicate()});
  });
}

TEST(SizeMismatch, ProcessesThroughTprunEndWithErrorsNotAbort) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", "dist_e2e", "mismatch"},
                       {{"DTENSOR_TIMEOUT_SEC", "30"}}, 120);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(contains(r.output, "terminate called")) << r.output;
  EXPECT_FALSE(contains(r.output, "killed by signal")) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(contains(r.output, "[rank" + std::to_string(rank) + "]: error: dtensor: all_reduce on group [0, 1] (rank " +
                                       std::to_string(rank) + " of 2): ranks passed tensors of different sizes"))
        << r.output;
  }
}
