// tprun's watchdog (tools/tprun/heartbeats.h) and its store socket (tools/tprun/spawn.h), with real jobs.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <thread>
#include <vector>

#include "harness/subprocess.h"

using namespace dtensor::testing;

namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<std::string> tprun(std::vector<std::string> args) {
  std::vector<std::string> argv = {bin_path("tprun"), "--nproc-per-node", "2", "--master-port", "0"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// The process group's own timeout far away (120 s), so what ends the job is the watchdog.
const std::map<std::string, std::string> kLongTimeout = {{"DTENSOR_TIMEOUT_SEC", "120"}};

}  // namespace

TEST(TprunWatchdog, NamesAFrozenRankAndStopsTheJob) {
  // Rank 1 SIGSTOPs itself in the middle of an all-reduce loop: its heartbeat stops; rank 0 waits in the
  // collective. Without the watchdog the job would wait out the 120 s timeout.
  auto r = run_process(tprun({"--watchdog-timeout", "3", "--grace-seconds", "1", "dist_e2e", "stop_mid", "1"}),
                       kLongTimeout, 60);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("tprun: watchdog: rank 1 \\(pid [0-9]+\\) is frozen: no heartbeat for "
                                                     "[0-9.]+ s \\(--watchdog-timeout 3.0 s; process stopped \\(SIGSTOP or a debugger\\)\\)")))
      << r.output;
  EXPECT_TRUE(contains(r.output, "tprun: stopping: rank 1 failed first")) << r.output;
  EXPECT_FALSE(contains(r.output, "collective completed")) << r.output;
}

TEST(TprunWatchdog, AFrozenRankRestartsTheJobWithMaxRestarts) {
  // Rank 1 freezes in the first round only: the watchdog fails that round, tprun restarts every rank, and the
  // second round completes.
  auto r = run_process(tprun({"--watchdog-timeout", "2", "--grace-seconds", "1", "--max-restarts", "1", "dist_e2e",
                              "stop_once", "1"}),
                       kLongTimeout, 60);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "is frozen: no heartbeat for")) << r.output;
  EXPECT_TRUE(contains(r.output, "tprun: restarting every rank (restart 1 of at most 1)")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank1]: sum=1 gathered=0,1")) << r.output;
}

TEST(TprunWatchdog, NamesARankThatNeverCallsTheCollectiveItsPeersWaitIn) {
  // Rank 1 sleeps (alive: its heartbeat goes on) instead of joining the all-reduce rank 0 waits in.
  auto r = run_process(tprun({"--watchdog-timeout", "2", "--grace-seconds", "1", "dist_e2e", "hang", "1", "100"}),
                       kLongTimeout, 60);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("tprun: watchdog: rank 1 \\(pid [0-9]+\\) made no progress for [0-9.]+ s "
                                                     "outside any collective while rank 0 \\(pid [0-9]+\\) waited [0-9.]+ s in a collective")))
      << r.output;
}

TEST(TprunWatchdog, APhaseExtendsTheAllowance) {
  // The same 4 s away from the collective, in a watchdog::Phase allowing 600 s more: the job completes.
  auto r = run_process(tprun({"--watchdog-timeout", "1", "dist_e2e", "phase", "1", "4"}), kLongTimeout, 60);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: collective completed")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank1]: collective completed")) << r.output;
  EXPECT_FALSE(contains(r.output, "watchdog")) << r.output;
}

TEST(TprunWatchdog, OffLeavesItToTheProcessGroupTimeout) {
  auto r = run_process(tprun({"--watchdog-timeout", "0", "--grace-seconds", "1", "dist_e2e", "hang", "1", "100"}),
                       {{"DTENSOR_TIMEOUT_SEC", "3"}}, 60);
  ASSERT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_FALSE(contains(r.output, "tprun: watchdog")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: error: dtensor: all_reduce on group [0, 1] (rank 0 of 2)")) << r.output;
}

TEST(TprunStore, HandsRankZeroTheListeningSocketAndNoOneElse) {
  auto r = run_process(tprun({"sh", "-c",
                              "fd=${DTENSOR_MASTER_LISTEN_FD:-none}; echo fd=$fd "
                              "$(readlink /proc/self/fd/${DTENSOR_MASTER_LISTEN_FD:-999} | cut -c1-7) hb=${TPRUN_HEARTBEAT_FD:+yes}"}),
                       {}, 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("\\[rank0\\]: fd=[0-9]+ socket: hb=yes\n"))) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank1]: fd=none hb=yes\n")) << r.output;
}

TEST(TprunStore, RefusesAPortInUseBeforeStartingAnyRank) {
  const ReservedPort taken;  // listening: another job's store
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--master-port", std::to_string(taken.port()), "sh",
                        "-c", "echo started"},
                       {}, 30);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "tprun: error: cannot serve the rendezvous store on 127.0.0.1:" +
                                     std::to_string(taken.port()) + ": the port is already in use")) << r.output;
  EXPECT_FALSE(contains(r.output, "started")) << r.output;
}

TEST(TprunStore, ParallelLaunchesUnderConnectionChurnAllSucceed) {
  // The race of "bind port 0, close, let rank 0 bind it later": an outgoing connection may be given that
  // ephemeral port in between. Here outgoing connections churn through the ephemeral range (a thread connects
  // to a local listener and closes, as fast as it can) while jobs launch in parallel, each by tprun and each
  // by hand with a ReservedPort. Every launch must rendezvous.
  std::atomic<bool> stop{false};
  std::atomic<long> connections{0};
  std::thread churn([&] {
    const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(listener, 512) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    const linger reset{1, 0};  // close with RST: no TIME_WAIT, so the churn never exhausts the ephemeral range
    std::vector<std::pair<int, int>> held;
    while (!stop) {
      const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) break;
      setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        close(fd);
        continue;
      }
      ++connections;
      held.emplace_back(fd, accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
      if (held.size() >= 200) {  // hold some ephemeral ports a while, then give them back
        for (auto [c, s] : held) close(c), close(s);
        held.clear();
      }
    }
    for (auto [c, s] : held) close(c), close(s);
    close(listener);
  });
  constexpr int kRounds = 3, kParallel = 4;
  int launched = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::vector<std::pair<int, std::string>> running;
    for (int j = 0; j < kParallel; ++j) {
      const std::string out = "/tmp/dtensor_port_stress_" + std::to_string(getpid()) + "_" + std::to_string(round * kParallel + j);
      running.emplace_back(start_process(tprun({"dist_e2e", "ok"}), {{"DTENSOR_TIMEOUT_SEC", "60"}}, out), out);
    }
    {
      const ReservedPort port;  // and one job launched by hand
      std::vector<std::pair<int, std::string>> by_hand;
      for (int rank = 0; rank < 2; ++rank) {
        auto env = port.env(rank);
        env.insert({{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "2"}, {"DTENSOR_TIMEOUT_SEC", "60"}});
        const std::string out = "/tmp/dtensor_port_stress_hand_" + std::to_string(getpid()) + "_" + std::to_string(rank);
        by_hand.emplace_back(start_process({bin_path("dist_e2e"), "ok"}, env, out), out);
      }
      for (auto& [pid, out] : by_hand) {
        auto r = wait_process(pid, out, 90);
        EXPECT_EQ(r.exit_code, 0) << r.output;
        EXPECT_TRUE(contains(r.output, "sum=1 gathered=0,1")) << r.output;
        ++launched;
      }
    }
    for (auto& [pid, out] : running) {
      auto r = wait_process(pid, out, 90);
      EXPECT_EQ(r.exit_code, 0) << r.output;
      EXPECT_TRUE(contains(r.output, "[rank1]: sum=1 gathered=0,1")) << r.output;
      ++launched;
    }
  }
  stop = true;
  churn.join();
  EXPECT_EQ(launched, kRounds * (kParallel + 2));
  EXPECT_GT(connections.load(), 1000) << "the churn did not run";
  std::printf("port stress: %d launches, %ld outgoing connections meanwhile\n", launched, connections.load());
}
