// Asynchronous collectives on the same-host shared-memory backend: Works waited on later (in any order),
// real progress while the caller does something else, blocking calls issued behind asynchronous ones, and
// failures that surface at wait() rather than at issue. Results are compared with Gloo's.
#include <gtest/gtest.h>

#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>

#include "dtensor/mesh/process_group.h"
#include "harness/multi_rank.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

std::shared_ptr<World> world_on(const std::string& backend, int rank, int world, const std::string& tag,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  InitOptions o{.timeout = timeout, .gloo_hostname = "127.0.0.1", .backend = backend};
  return std::make_shared<World>(c10::make_intrusive<c10d::PrefixStore>(tag + "/" + backend, current_world()->store()),
                                 rank, world, o);
}

}  // namespace

TEST(ShmAsync, WorksWaitedOnLaterInAnyOrderMatchGloo) {
  run_ranks(2, [](int rank, int world) {
    auto fast = world_on("shm", rank, world, "later")->world_group();
    auto gloo = world_on("gloo", rank, world, "later")->world_group();
    ASSERT_EQ(fast->backend_name(), "dtensor_shm");
    // Small (one-shot) and large (chunked) messages, two collective kinds, issued before any wait.
    at::Tensor small = seeded_randn(10 + rank, {300}), large = seeded_randn(20 + rank, {600000});
    at::Tensor in = seeded_randn(30 + rank, {1000}), gathered = at::empty({2000});
    at::Tensor a = small.clone(), b = large.clone();
    Work wa = fast->all_reduce_async(a, ReduceOp::SUM);
    Work wg = fast->all_gather_into_async(gathered, in);
    Work wb = fast->all_reduce_async(b, ReduceOp::AVG);
    at::Tensor busy = at::mm(seeded_randn(1, {256, 256}), seeded_randn(2, {256, 256}));  // compute meanwhile
    // A blocking collective issued behind the queued ones runs after them (same order on every rank).
    at::Tensor c = at::full({7}, rank + 1.0);
    fast->all_reduce_(c, ReduceOp::MAX);
    EXPECT_TRUE(at::equal(c, at::full({7}, 2.0)));
    wb.wait();
    wg.wait();
    wa.wait();
    EXPECT_FALSE(wa.pending());
    at::Tensor ra = small.clone(), rb = large.clone(), rg = at::empty({2000});
    gloo->all_reduce_(ra, ReduceOp::SUM);
    gloo->all_reduce_(rb, ReduceOp::AVG);
    gloo->all_gather_into(rg, in);
    EXPECT_TRUE(at::equal(a, ra));
    EXPECT_TRUE(at::allclose(b, rb));
    EXPECT_TRUE(at::equal(gathered, rg));
    EXPECT_GT(busy.abs().sum().item<float>(), 0);
    // A Work moves: into a container, and out of it into another Work.
    std::vector<Work> moved;
    at::Tensor d = at::full({3}, 1.0);
    moved.push_back(fast->all_reduce_async(d, ReduceOp::SUM));
    Work taken(std::move(moved.back()));
    EXPECT_FALSE(moved.back().pending());
    taken.wait();
    EXPECT_TRUE(at::equal(d, at::full({3}, 2.0)));
  });
}

TEST(ShmAsync, CollectiveProgressesWhileTheCallerIsBusyElsewhere) {
  // Rank 0 issues an all_reduce and then blocks on the store until rank 1 says its matching blocking
  // all_reduce has finished: that can only happen if rank 0's collective ran without rank 0's thread.
  run_ranks(2, [](int rank, int world) {
    auto w = world_on("shm", rank, world, "progress");
    auto group = w->world_group();
    at::Tensor x = at::full({100000}, rank + 1.0);
    if (rank == 0) {
      Work work = group->all_reduce_async(x, ReduceOp::SUM);
      w->store()->wait({"rank1_done"}, std::chrono::milliseconds(20000));  // "compute" that is not a wait()
      work.wait();
    } else {
      group->all_reduce_(x, ReduceOp::SUM);
      w->store()->set("rank1_done", std::vector<uint8_t>{1});
    }
    EXPECT_TRUE(at::equal(x, at::full({100000}, 3.0)));
  });
}

TEST(ShmAsync, FailuresSurfaceAtWaitNotAtIssue) {
  RunOptions options;
  options.expect_all_succeed = false;
  std::atomic<int> issued{0};
  auto errors = run_ranks(2, [&](int rank, int world) {
    auto group = world_on("shm", rank, world, "async_mismatch")->world_group();
    at::Tensor x = at::ones({4 - rank, 2});
    Work work = group->all_reduce_async(x, ReduceOp::SUM);
    ++issued;  // the issue did not throw
    EXPECT_TRUE(work.pending());
    work.wait();
  }, options);
  EXPECT_EQ(issued.load(), 2);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("dtensor: all_reduce on group [0, 1] (rank " + std::to_string(r) + " of 2)"),
              std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("ranks passed tensors of different sizes"), std::string::npos) << errors[r];
  }
  // A peer that never comes: issue returns, wait() fails naming it within the group's timeout.
  RunOptions stop = options;
  stop.collective_timeout = std::chrono::milliseconds(1500);
  errors = run_ranks(2, [](int rank, int world) {
    auto group = world_on("shm", rank, world, "async_stop", std::chrono::milliseconds(1500))->world_group();
    if (rank == 1) throw std::runtime_error("rank 1 stops");
    at::Tensor x = at::ones({8});
    Work work = group->all_reduce_async(x, ReduceOp::SUM);
    work.wait();
  }, stop);
  EXPECT_NE(errors[0].find("rank 1 (group rank 1, pid"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("did not arrive within 1500 ms"), std::string::npos) << errors[0];
}
