// A peer that never arrives: the waiting rank says on stderr where it waits and for whom (first after
// min(5 s, timeout / 2)), then fails naming the ranks that never joined.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "dtensor/mesh/process_group.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::map<std::string, std::string> rank_env(int rank, int world, const ReservedPort& port, const std::string& timeout_s) {
  std::map<std::string, std::string> env{{"RANK", std::to_string(rank)},       {"WORLD_SIZE", std::to_string(world)},
                                         {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
                                         {"DTENSOR_TIMEOUT_SEC", timeout_s}};
  for (const auto& [k, v] : port.env(rank)) env[k] = v;
  return env;
}

// A store whose writes of the "built" marker (the last step of building a group) take 800 ms: the member
// that uses it is slow to finish its side, as a loaded machine makes it.
class SlowToFinishStore : public c10d::PrefixStore {
 public:
  SlowToFinishStore(std::string prefix, c10::intrusive_ptr<c10d::Store> store, std::atomic<int64_t>* finished_ns)
      : c10d::PrefixStore(std::move(prefix), std::move(store)), finished_ns_(finished_ns) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    const bool marker = key.find("/built/") != std::string::npos;
    if (marker) std::this_thread::sleep_for(std::chrono::milliseconds(800));
    if (marker) finished_ns_->store(std::chrono::steady_clock::now().time_since_epoch().count());
    c10d::PrefixStore::set(key, value);
  }

 private:
  std::atomic<int64_t>* finished_ns_;
};

}  // namespace

// A group exists on no member before it exists on all: a member that returns from building the group and
// drops it at once must not break a slower member's connect (Gloo: "Connection closed by peer"), as it did
// in CI. Rank 0 is made slow to finish its side; rank 1 must not return before rank 0 has finished.
TEST(Rendezvous, AGroupIsBuiltOnNoMemberBeforeEveryMemberHasBuiltIt) {
  std::atomic<int64_t> rank0_finished{0}, rank1_returned{0};
  auto errors = run_ranks(2, [&](int rank, int world) {
    InitOptions g{.timeout = std::chrono::milliseconds(20000), .gloo_hostname = "127.0.0.1", .backend = "gloo"};
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::PrefixStore>("slow", current_world()->store());
    if (rank == 0) store = c10::make_intrusive<SlowToFinishStore>("slow", current_world()->store(), &rank0_finished);
    {
      World w(store, rank, world, g);
      w.world_group();  // built, then dropped at once on rank 1
      if (rank == 1) rank1_returned.store(std::chrono::steady_clock::now().time_since_epoch().count());
    }
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  ASSERT_GT(rank0_finished.load(), 0);
  EXPECT_GE(rank1_returned.load(), rank0_finished.load())
      << "rank 1 returned " << (rank0_finished.load() - rank1_returned.load()) / 1000000 << " ms before rank 0 "
      << "finished building its side of the group";
}

TEST(Rendezvous, ThreadRankReportsAndNamesTheMissingRanks) {
  // Rank 0 of a world of 3 over a store where only rank 2 ever announces itself.
  auto store = c10::make_intrusive<c10d::HashStore>();
  InitOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  std::thread rank2([&] {
    try {
      init_process_group(store, 2, 3, options);
    } catch (const std::exception&) {  // times out too
    }
  });
  ::testing::internal::CaptureStderr();
  std::string err = error_of([&] { init_process_group(store, 0, 3, options); });
  std::string printed = ::testing::internal::GetCapturedStderr();
  rank2.join();
  EXPECT_TRUE(contains(printed, "dtensor: rank 0 of 3 waiting at the caller's store for ranks [1] to join "
                                "(joined: [0, 2]; ")) << printed;
  EXPECT_TRUE(contains(err, "dtensor: rank 0 of 3 could not rendezvous at the caller's store within 1500 ms: "
                            "ranks [1] never joined (joined: [0, 2];")) << err;
}

TEST(Rendezvous, ProcessRankZeroReportsTheRankThatNeverStarts) {
  const ReservedPort reserved;
  const int port = reserved.port();
  auto r = run_process({bin_path("dist_e2e"), "ok"}, rank_env(0, 2, reserved, "2"), 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::string where = "127.0.0.1:" + std::to_string(port);
  EXPECT_TRUE(contains(r.output, "dtensor: rank 0 of 2 waiting at " + where + " for ranks [1] to join (joined: [0]; 1 s of 2 s)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "error: dtensor: rank 0 of 2 could not rendezvous at " + where +
                                     " within 2000 ms: ranks [1] never joined (joined: [0];")) << r.output;
}

TEST(Rendezvous, ProcessReportsTheStoreThatIsNotServed) {
  // Rank 0 (the store's server) never starts: rank 1 reports the address it keeps trying.
  const ReservedPort reserved(ReservedPort::REFUSING);
  const int port = reserved.port();
  auto r = run_process({bin_path("dist_e2e"), "ok"}, rank_env(1, 2, reserved, "2"), 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  std::string where = "127.0.0.1:" + std::to_string(port);
  EXPECT_TRUE(contains(r.output, "dtensor: rank 1 of 2 waiting for the rendezvous store at " + where +
                                     " (served by rank 0, not reachable yet; 1 s of 2 s)")) << r.output;
  EXPECT_TRUE(contains(r.output, "error: dtensor: rank 1 of 2 could not rendezvous at " + where)) << r.output;
}
