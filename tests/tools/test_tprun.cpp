// tprun: the torchrun variables, line prefixes, and a real multi-process job.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "harness/subprocess.h"

using namespace dtensor::testing;

namespace {
bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}
// Until both ranks printed "ready" into `out` (at most 10 s), before signalling them.
void wait_until_both_ranks_ready(const std::string& out) {
  for (int i = 0; i < 200; ++i) {
    std::ifstream in(out);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (contains(s, "[rank0]: ready") && contains(s, "[rank1]: ready")) return;
    usleep(50000);
  }
}
}  // namespace

TEST(Tprun, SetsTorchrunVariablesAndPrefixesLines) {
  // Unbound (--cpu-bind none): torchrun's one OpenMP thread a rank.
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                        "--master-port", "29876", "--cpu-bind", "none", "sh", "-c",
                        "echo $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS"},
                       {{"OMP_NUM_THREADS", ""}}, 30);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank2]: 2 4 0 2 127.0.0.1 29876 1\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank3]: 3 4 1 2 127.0.0.1 29876 1\n")) << r.output;
}

TEST(Tprun, KeepsAUserOmpSettingAndRejectsBadOptions) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "sh", "-c", "echo omp=$OMP_NUM_THREADS"},
                       {{"OMP_NUM_THREADS", "3"}}, 30);
  EXPECT_TRUE(contains(r.output, "[rank1]: omp=3")) << r.output;
  r = run_process({bin_path("tprun"), "--nproc-per-node", "0", "true"}, {}, 30);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.output, "tprun: error: --nproc-per-node")) << r.output;
  r = run_process({bin_path("tprun"), "no-such-program-xyz"}, {}, 30);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(contains(r.output, "cannot execute 'no-such-program-xyz'")) << r.output;
}

namespace {
// This process's CPUs, as the kernel lists them (/proc/self/status's Cpus_allowed_list, e.g. "0-1").
std::vector<int> own_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}
// What "[rankN]: cpus=... omp=... Cpus_allowed_list: ..." says for rank n, "" if absent.
std::string rank_line(const std::string& output, int n) {
  const std::string prefix = "[rank" + std::to_string(n) + "]: ";
  const size_t at = output.find(prefix);
  if (at == std::string::npos) return "";
  return output.substr(at + prefix.size(), output.find('\n', at) - at - prefix.size());
}
const char* kShowBinding = "echo \"cpus=$TPRUN_CPUS omp=$OMP_NUM_THREADS $(grep Cpus_allowed_list /proc/self/status | tr -d '\\t')\"";
}  // namespace

TEST(Tprun, CpuBindGivesEachRankItsCpusAndThreads) {
  const std::vector<int> cpus = own_cpus();
  ASSERT_FALSE(cpus.empty());
  const std::string first = std::to_string(cpus[0]), last = std::to_string(cpus.back());
  // A list per rank (vLLM's VLLM_CPU_OMP_THREADS_BIND form): each rank runs on its own, one thread per CPU.
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--cpu-bind", first + "|" + first + "," + last,
                        "sh", "-c", kShowBinding}, {{"OMP_NUM_THREADS", ""}}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(rank_line(r.output, 0), "cpus=" + first + " omp=1 Cpus_allowed_list:" + first) << r.output;
  const std::string both = first + (cpus.back() == cpus[0] + 1 ? "-" : ",") + last;
  if (cpus.size() > 1) {
    EXPECT_EQ(rank_line(r.output, 1), "cpus=" + both + " omp=2 Cpus_allowed_list:" + both) << r.output;
  }
  // auto: whole cores split between the ranks when there are enough of them, else no binding.
  r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "sh", "-c", kShowBinding}, {{"OMP_NUM_THREADS", ""}}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string line0 = rank_line(r.output, 0), line1 = rank_line(r.output, 1);
  if (cpus.size() >= 2 && line0.rfind("cpus= ", 0) != 0) {
    // Bound: two different, non-empty lists, each rank's mask its list.
    const std::string list0 = line0.substr(5, line0.find(' ') - 5), list1 = line1.substr(5, line1.find(' ') - 5);
    EXPECT_FALSE(list0.empty());
    EXPECT_NE(list0, list1) << r.output;
    EXPECT_TRUE(contains(line0, "Cpus_allowed_list:" + list0)) << r.output;
    EXPECT_TRUE(contains(line1, "Cpus_allowed_list:" + list1)) << r.output;
  } else {
    // Fewer cores than ranks (hardware threads of one core): unbound, torchrun's one thread.
    EXPECT_TRUE(line0.rfind("cpus= omp=1 ", 0) == 0) << r.output;
  }
  // none: unbound.
  r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--cpu-bind", "none", "sh", "-c", kShowBinding},
                  {{"OMP_NUM_THREADS", ""}}, 30);
  EXPECT_TRUE(rank_line(r.output, 1).rfind("cpus= omp=1 ", 0) == 0) << r.output;
  // Bad lists: one error each, exit 2, before any rank starts.
  for (const auto& [spec, says] : std::vector<std::pair<std::string, std::string>>{
           {first, "gives 1 CPU lists for --nproc-per-node 2"},
           {"0-x|1", "'0-x' is not a CPU list"},
           {first + "|1023", "CPU 1023 is not one tprun may run on"}}) {
    r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--cpu-bind", spec, "echo", "started"}, {}, 30);
    EXPECT_EQ(r.exit_code, 2) << spec << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "tprun: error: --cpu-bind")) << r.output;
    EXPECT_TRUE(contains(r.output, says)) << r.output;
    EXPECT_FALSE(contains(r.output, "started")) << r.output;
  }
}

TEST(Tprun, ForwardsSigterm) {
  std::string out = "/tmp/dtensor_tprun_sig_" + std::to_string(getpid());
  int pid = start_process({bin_path("tprun"), "--nproc-per-node", "2", "sh", "-c",
                           "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done"},
                          {}, out);
  wait_until_both_ranks_ready(out);
  kill(pid, SIGTERM);
  auto r = wait_process(pid, out, 30);
  EXPECT_FALSE(r.timed_out);
  // Every rank handled it and exited 0 (a saved preemption, a drained server): tprun exits 0, the ranks' status.
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: got TERM")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank1]: got TERM")) << r.output;
}

TEST(Tprun, ExitsWithTheSignalWhenRanksDieOfIt) {
  std::string out = "/tmp/dtensor_tprun_sig2_" + std::to_string(getpid());
  int pid = start_process({bin_path("tprun"), "--nproc-per-node", "2", "sh", "-c", "echo ready; while :; do sleep 0.05; done"},
                          {}, out);
  wait_until_both_ranks_ready(out);
  kill(pid, SIGTERM);
  auto r = wait_process(pid, out, 30);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
}

namespace {
size_t count(const std::string& haystack, const std::string& needle) {
  size_t n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}
}  // namespace

// A usage error is found by every rank and printed by rank 0 alone: whichever rank exits first, rank 0's line is
// shown once and tprun exits 2. Rank 0's print is delayed by 1.5 s (rank 1 exits first), and not.
TEST(Tprun, UsageErrorIsPrintedOnceWhicheverRankExitsFirst) {
  for (const char* delay : {"1500", "0"}) {
    auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", bin_path("llama_train"), "--steps", "5", "--stepz", "5"},
                         {{"DTENSOR_TEST_USAGE_ERROR_DELAY_MS", delay}}, 60);
    EXPECT_FALSE(r.timed_out);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(count(r.output, "error:"), 1u) << r.output;
    EXPECT_TRUE(contains(r.output, "[rank0]: error: unknown option --stepz (did you mean --steps?)")) << r.output;
    EXPECT_FALSE(contains(r.output, "failed first")) << r.output;
    EXPECT_TRUE(contains(r.output, "exited with status 2 (a usage error), as every rank did")) << r.output;
  }
}

// A rank that exits 2 while another goes on: after tprun's bounded wait (10 s) the others are stopped; exit 2.
TEST(Tprun, UsageErrorOnOneRankStopsTheOthersAfterABoundedWait) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "sh", "-c",
                        "if [ $RANK = 1 ]; then echo 'error: bad flag' >&2; exit 2; fi; sleep 60"},
                       {}, 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank1]: error: bad flag")) << r.output;
  EXPECT_TRUE(contains(r.output, "the other ranks were stopped")) << r.output;
}

TEST(Tprun, RunsAFourProcessJob) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "4", "--master-port", "0", "dist_e2e", "ok"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    std::string p = "[rank" + std::to_string(rank) + "]: ";
    EXPECT_TRUE(contains(r.output, p + "sum=6 gathered=0,1,2,3")) << r.output;
    EXPECT_TRUE(contains(r.output, p + "coord=" + std::to_string(rank / 2) + "," + std::to_string(rank % 2) +
                                       " tp_sum=" + std::to_string(rank / 2 * 4 + 1)))
        << r.output;
  }
}
