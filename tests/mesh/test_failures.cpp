// A rank that dies, throws or hangs makes the others fail with a clear error within the timeout, never
// hang; bad environments and busy ports are reported at start-up.
#include <arpa/inet.h>
#include <signal.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dtensor/core/error.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"

using namespace dtensor;
using namespace dtensor::testing;

namespace {

std::map<std::string, std::string> rank_env(int rank, int world, int port) {
  return {{"RANK", std::to_string(rank)},  {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(rank)}, {"LOCAL_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}, {"DTENSOR_TIMEOUT_SEC", "5"}};
}

std::map<std::string, std::string> rank_env(int rank, int world, const ReservedPort& port) {
  auto env = rank_env(rank, world, port.port());
  for (const auto& [k, v] : port.env(rank)) env[k] = v;
  return env;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace

TEST(Failures, ThreadRankThatThrowsMakesPeersTimeOut) {
  RunOptions options;
  options.collective_timeout = std::chrono::milliseconds(2000);
  options.expect_all_succeed = false;
  auto errors = run_ranks(2, [](int rank, int) {
    auto mesh = init_device_mesh("cpu", {2});
    if (rank == 1) throw std::runtime_error("rank 1 fails before the collective");
    all_reduce(at::ones({4}), ReduceOp::SUM, mesh, 0);
  }, options);
  EXPECT_TRUE(contains(errors[1], "rank 1 fails")) << errors[1];
  EXPECT_TRUE(contains(errors[0], "dtensor: all_reduce on group [0, 1] (rank 0 of 2)")) << errors[0];
}

TEST(Failures, ProcessThatDiesMakesPeerExitWithError) {
  // No launcher: the surviving rank must notice by itself.
  const ReservedPort port;
  std::string out0 = "/tmp/dtensor_fail0_" + std::to_string(getpid()), out1 = out0 + "_1";
  int p0 = start_process({bin_path("dist_e2e"), "die", "1", "7"}, rank_env(0, 2, port), out0);
  int p1 = start_process({bin_path("dist_e2e"), "die", "1", "7"}, rank_env(1, 2, port), out1);
  auto r1 = wait_process(p1, out1, 60);
  auto r0 = wait_process(p0, out0, 60);
  EXPECT_EQ(r1.exit_code, 7);
  EXPECT_FALSE(r0.timed_out);
  EXPECT_EQ(r0.exit_code, 1) << r0.output;
  EXPECT_TRUE(contains(r0.output, "error: dtensor: all_reduce on group [0, 1] (rank 0 of 2)")) << r0.output;
}

TEST(Failures, TprunReportsTheRankThatDied) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", "dist_e2e", "die", "1", "7"},
                       {{"DTENSOR_TIMEOUT_SEC", "5"}}, 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "tprun: rank 1 (local rank 1, pid")) << r.output;
  EXPECT_TRUE(contains(r.output, "exited with status 7")) << r.output;
  EXPECT_TRUE(contains(r.output, "tprun: stopping: rank 1 failed first")) << r.output;
}

TEST(Failures, TprunReportsARankKilledByASignal) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", "dist_e2e", "throw", "0"},
                       {{"DTENSOR_TIMEOUT_SEC", "5"}}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: terminate called after throwing")) << r.output;
  EXPECT_TRUE(contains(r.output, "tprun: rank 0 (local rank 0, pid")) << r.output;
  EXPECT_TRUE(contains(r.output, "was killed by signal 6")) << r.output;
}

// A rank that crashes says which signal and where (fatal_signals.h) before it dies of it: tprun still names the signal.
TEST(Failures, CrashingRankPrintsItsSignalAndBacktrace) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", "dist_e2e", "segfault", "1"},
                       {{"DTENSOR_TIMEOUT_SEC", "5"}}, 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "dtensor: rank 1 (pid ")) << r.output;
  EXPECT_TRUE(contains(r.output, "): fatal signal SIGSEGV (Segmentation fault)")) << r.output;
  EXPECT_TRUE(contains(r.output, "; backtrace:")) << r.output;
  EXPECT_TRUE(contains(r.output, "dist_e2e(")) << "the backtrace names the program's frames: " << r.output;
  EXPECT_TRUE(contains(r.output, "was killed by signal 11")) << r.output;
}

TEST(Failures, HangingRankMakesPeersTimeOut) {
  // Rank 1 stays alive but never joins: rank 0 must give up after DTENSOR_TIMEOUT_SEC (3 s), and tprun
  // then stops rank 1.
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0", "--grace-seconds", "1",
                        "dist_e2e", "hang", "1", "100"},
                       {{"DTENSOR_TIMEOUT_SEC", "3"}}, 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: error: dtensor: all_reduce on group [0, 1] (rank 0 of 2)")) << r.output;
  EXPECT_TRUE(contains(r.output, "tprun: rank 0 (local rank 0, pid")) << r.output;
}

TEST(Failures, FrozenRankIsNamedOnGloo) {
  // Rank 1 stops itself (SIGSTOP) between two collectives, on Gloo: rank 0 times out, and its error says that
  // rank 1 is stopped, not dead (Gloo's own error names neither). No launcher.
  const ReservedPort port;
  std::string out0 = "/tmp/dtensor_stop0_" + std::to_string(getpid()), out1 = out0 + "_1";
  auto env = [&](int rank) {
    auto e = rank_env(rank, 2, port);
    e["DTENSOR_BACKEND"] = "gloo";
    e["DTENSOR_TIMEOUT_SEC"] = "3";
    return e;
  };
  int p0 = start_process({bin_path("dist_e2e"), "stop_mid", "1"}, env(0), out0);
  int p1 = start_process({bin_path("dist_e2e"), "stop_mid", "1"}, env(1), out1);
  auto r0 = wait_process(p0, out0, 60);
  kill(p1, SIGKILL);
  wait_process(p1, out1, 30);
  EXPECT_FALSE(r0.timed_out);
  EXPECT_EQ(r0.exit_code, 1) << r0.output;
  EXPECT_TRUE(contains(r0.output, "error: dtensor: all_reduce on group [0, 1] (rank 0 of 2)")) << r0.output;
  EXPECT_TRUE(contains(r0.output, "rank 1: stopped (SIGSTOP or a debugger) (pid " + std::to_string(p1) + ", this host)"))
      << r0.output;
}

TEST(Failures, KilledStoreServerIsNamedOnGloo) {
  // Rank 0, whose process serves the job's store, SIGKILLs itself mid-all-reduce, on Gloo. The survivors'
  // errors still say what became of it: they describe the members from what they read when the group was
  // made, not from the store, which died with rank 0. No launcher.
  const int world = 3;
  const ReservedPort port;
  const std::string out = "/tmp/dtensor_kill_server_" + std::to_string(getpid()) + "_";
  std::vector<int> pids;
  for (int r = 0; r < world; ++r) {
    auto env = rank_env(r, world, port);
    env["DTENSOR_BACKEND"] = "gloo";
    pids.push_back(start_process({bin_path("dist_e2e"), "kill_mid", "0"}, env, out + std::to_string(r)));
  }
  wait_process(pids[0], out + "0", 60);
  for (int r : {1, 2}) {
    auto res = wait_process(pids[r], out + std::to_string(r), 60);
    EXPECT_FALSE(res.timed_out);
    EXPECT_EQ(res.exit_code, 1) << res.output;
    EXPECT_TRUE(contains(res.output, "error: dtensor: all_reduce on group [0, 1, 2] (rank " + std::to_string(r) + " of 3)"))
        << res.output;
    EXPECT_TRUE(contains(res.output, "rank 0: exited (pid " + std::to_string(pids[0]) + ", this host)")) << res.output;
  }
}

TEST(Failures, BadEnvironmentIsNamed) {
  auto r = run_process({bin_path("dist_e2e"), "ok"}, {{"RANK", ""}, {"WORLD_SIZE", "2"}}, 30);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "error: dtensor: environment variable RANK is not set")) << r.output;
  auto env = rank_env(3, 2, 29999);
  r = run_process({bin_path("dist_e2e"), "ok"}, env, 30);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "RANK=3 is outside [0, WORLD_SIZE=2)")) << r.output;
}

TEST(Failures, BusyPortIsReported) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto r = run_process({bin_path("dist_e2e"), "ok"}, rank_env(0, 1, ntohs(addr.sin_port)), 30);
  close(fd);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "already in use")) << r.output;
}

TEST(Failures, PeerThatNeverArrivesTimesOut) {
  const ReservedPort port;
  auto env = rank_env(0, 2, port);
  env["DTENSOR_TIMEOUT_SEC"] = "2";
  auto r = run_process({bin_path("dist_e2e"), "ok"}, env, 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "dtensor: rank 0 of 2 could not rendezvous at 127.0.0.1:")) << r.output;
}

// After a collective of a group failed (here: the peer left, so it timed out), the group is failed: the
// next collective fails at once naming the first failure, instead of waiting another timeout for a peer
// that will not come, and destroying the group does not join Gloo workers that may still wait on it.
TEST(Failures, AFailedGroupFailsAtOnceAfterwards) {
  for (const char* backend : {"gloo", "shm"}) {
    const char* before = std::getenv("DTENSOR_BACKEND");
    std::string saved = before ? before : "";
    setenv("DTENSOR_BACKEND", backend, 1);
    RunOptions options;
    options.collective_timeout = std::chrono::milliseconds(1000);
    options.expect_all_succeed = false;
    auto errors = run_ranks(2, [&](int rank, int) {
      auto pg = current_world()->world_group();
      EXPECT_EQ(pg->backend_name(), std::string(backend) == "shm" ? "dtensor_shm" : "gloo");
      if (rank == 1) throw std::runtime_error("rank 1 leaves");
      auto t = at::ones({4});
      EXPECT_THROW(pg->all_reduce_(t, ReduceOp::SUM), dtensor::Error);
      EXPECT_TRUE(pg->failed());
      pg->all_reduce_(t, ReduceOp::SUM);
    }, options);
    if (before) setenv("DTENSOR_BACKEND", saved.c_str(), 1); else unsetenv("DTENSOR_BACKEND");
    EXPECT_TRUE(contains(errors[0], "dtensor: all_reduce on group [0, 1] (rank 0 of 2) cannot start: the group failed "
                                    "earlier (all_reduce on group [0, 1] (rank 0 of 2)")) << backend << ": " << errors[0];
  }
}
