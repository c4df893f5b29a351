// tprun: the torchrun variables, line prefixes, and a real multi-process job.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

#include "harness/subprocess.h"

using namespace dtensor::testing;

namespace {
bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}
}  // namespace

TEST(Tprun, SetsTorchrunVariablesAndPrefixesLines) {
  auto r = run_process({bin_path("tprun"), "--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "1",
                        "--master-port", "29876", "sh", "-c",
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

TEST(Tprun, ForwardsSigterm) {
  std::string out = "/tmp/dtensor_tprun_sig_" + std::to_string(getpid());
  int pid = start_process({bin_path("tprun"), "--nproc-per-node", "2", "sh", "-c",
                           "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done"},
                          {}, out);
  // Wait for both ranks to be up before signalling.
  for (int i = 0; i < 200; ++i) {
    std::ifstream in(out);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (contains(s, "[rank0]: ready") && contains(s, "[rank1]: ready")) break;
    usleep(50000);
  }
  kill(pid, SIGTERM);
  auto r = wait_process(pid, out, 30);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank0]: got TERM")) << r.output;
  EXPECT_TRUE(contains(r.output, "[rank1]: got TERM")) << r.output;
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
