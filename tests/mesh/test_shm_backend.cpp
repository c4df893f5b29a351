// The same-host shared-memory backend against Gloo's results: every collective, every dtype, sizes from 0
// elements to several MiB (crossing the one-shot limit and the chunk size), worlds 2, 3 and 4, sub-groups
// of a 2x2 mesh running concurrently, the in-band size check, a killed rank, and nothing left in /dev/shm.
#include <dirent.h>
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <signal.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <set>
#include <thread>

#include "dtensor/mesh/process_group.h"
#include "harness/multi_rank.h"
#include "harness/subprocess.h"
#include "mesh/shm/reduce_kernels.h"
#include "mesh/shm/stream_copy.h"

using namespace dtensor;
using namespace dtensor::testing;
namespace kernels = dtensor::detail::shm;

namespace {

// Two worlds over the harness's store, forced onto each backend.
struct BothWorlds {
  std::shared_ptr<World> fast, gloo;
  BothWorlds(int rank, int world, const std::string& tag) {
    auto base = current_world()->store();
    InitOptions f{.timeout = std::chrono::milliseconds(20000), .gloo_hostname = "127.0.0.1", .backend = "shm"};
    InitOptions g = f;
    g.backend = "gloo";
    fast = std::make_shared<World>(c10::make_intrusive<c10d::PrefixStore>(tag + "/shm", base), rank, world, f);
    gloo = std::make_shared<World>(c10::make_intrusive<c10d::PrefixStore>(tag + "/gloo", base), rank, world, g);
  }
};

// Small integers: sums over <= 4 ranks are exact in every dtype, so Gloo's and ours must be equal.
at::Tensor small_ints(int seed, int64_t numel, at::ScalarType dtype) {
  return (seeded_randn(seed, {numel}) * 3).round().clamp(-8, 8).to(dtype);
}

bool same(const at::Tensor& a, const at::Tensor& b) { return a.sizes() == b.sizes() && at::equal(a, b); }

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong};

std::set<std::string> dtensor_segments() {
  std::set<std::string> names;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* e = readdir(dir)) {
      if (std::string(e->d_name).rfind("dtensor-", 0) == 0) names.insert(e->d_name);
    }
    closedir(dir);
  }
  return names;
}

void check_every_collective(int rank, int world, const std::vector<int64_t>& sizes,
                            const std::vector<at::ScalarType>& dtypes) {
  BothWorlds worlds(rank, world, "every");
  auto fast = worlds.fast->world_group();
  auto gloo = worlds.gloo->world_group();
  ASSERT_EQ(fast->backend_name(), "dtensor_shm");
  for (at::ScalarType dtype : dtypes) {
    for (int64_t n : sizes) {
      const std::string where = std::string(c10::toString(dtype)) + " numel " + std::to_string(n) + " world " +
                                std::to_string(world);
      at::Tensor mine = small_ints(1000 * rank + static_cast<int>(n % 997), n, dtype);
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MAX, ReduceOp::MIN, ReduceOp::AVG}) {
        if (op == ReduceOp::AVG && dtype == at::kLong) continue;  // avg divides: not an integer result
        at::Tensor a = mine.clone(), b = mine.clone();
        fast->all_reduce_(a, op);
        gloo->all_reduce_(b, op);
        if (op == ReduceOp::AVG) EXPECT_TRUE(at::allclose(a.to(at::kDouble), b.to(at::kDouble), 1e-2, 1e-2)) << where;
        else EXPECT_TRUE(same(a, b)) << "all_reduce " << reduce_op_name(op) << " " << where;
      }
      at::Tensor ga = at::empty({n * world}, mine.options()), gb = at::empty({n * world}, mine.options());
      fast->all_gather_into(ga, mine);
      gloo->all_gather_into(gb, mine);
      EXPECT_TRUE(same(ga, gb)) << "all_gather " << where;

      at::Tensor big = small_ints(77 + rank, n * world, dtype);
      for (ReduceOp op : {ReduceOp::SUM, ReduceOp::MAX}) {
        at::Tensor ra = at::empty({n}, mine.options()), rb = at::empty({n}, mine.options());
        fast->reduce_scatter_into(ra, big, op);
        gloo->reduce_scatter_into(rb, big, op);
        EXPECT_TRUE(same(ra, rb)) << "reduce_scatter " << reduce_op_name(op) << " " << where;
      }
      // Uneven all_to_all: rank r sends (r + k + n) % 3 rows of width 5 (scaled with n) to rank k.
      const int64_t width = 1 + n / 64;
      std::vector<int64_t> in_splits, out_splits;
      for (int k = 0; k < world; ++k) in_splits.push_back((rank + k + n) % 3 * (1 + n / 4096));
      for (int k = 0; k < world; ++k) out_splits.push_back((k + rank + n) % 3 * (1 + n / 4096));
      int64_t rows_in = 0, rows_out = 0;
      for (int k = 0; k < world; ++k) rows_in += in_splits[k], rows_out += out_splits[k];
      at::Tensor tin = small_ints(5 + rank, rows_in * width, dtype).view({rows_in, width});
      at::Tensor ta = at::empty({rows_out, width}, mine.options()), tb = at::empty({rows_out, width}, mine.options());
      fast->all_to_all_single(ta, tin, out_splits, in_splits);
      gloo->all_to_all_single(tb, tin, out_splits, in_splits);
      EXPECT_TRUE(same(ta, tb)) << "all_to_all " << where;

      const int src = static_cast<int>(n % world);
      at::Tensor ba = mine.clone(), bb = mine.clone();
      fast->broadcast_(ba, src);
      gloo->broadcast_(bb, src);
      EXPECT_TRUE(same(ba, bb)) << "broadcast " << where;
      fast->barrier();
    }
  }
}

}  // namespace

TEST(ShmReduceKernels, MatchTheReferencePath) {
  for (at::ScalarType dtype : kDtypes) {
    for (int64_t n : {0, 1, 1023, 1024, 5000}) {
      for (auto op : {kernels::Reduction::SUM, kernels::Reduction::MAX, kernels::Reduction::MIN}) {
        std::vector<at::Tensor> srcs;
        std::vector<const void*> ptrs;
        for (int k = 0; k < 3; ++k) srcs.push_back((seeded_randn(k, {n}) * 100).to(dtype));
        for (auto& s : srcs) ptrs.push_back(s.data_ptr());
        at::Tensor fast = at::empty({n}, srcs[0].options()), naive = at::empty({n}, srcs[0].options());
        kernels::reduce_into(fast.data_ptr(), ptrs.data(), 3, n, dtype, op);
        kernels::reduce_into_reference(naive.data_ptr(), ptrs.data(), 3, n, dtype, op);
        EXPECT_TRUE(at::equal(fast, naive)) << c10::toString(dtype) << " " << n;
        // With streaming stores, as reduce_scatter writes a large output.
        at::Tensor streamed = at::empty({n}, srcs[0].options());
        kernels::reduce_into(streamed.data_ptr(), ptrs.data(), 3, n, dtype, op, /*streaming=*/true);
        EXPECT_TRUE(at::equal(streamed, naive)) << c10::toString(dtype) << " " << n << " streaming";
        // In place into the first source, as the large all_reduce does.
        kernels::reduce_into(srcs[0].data_ptr(), ptrs.data(), 3, n, dtype, op);
        EXPECT_TRUE(at::equal(srcs[0], naive)) << c10::toString(dtype) << " " << n << " in place";
      }
    }
  }
}

TEST(ShmStreamCopy, MatchesMemcpyAtAnyAlignmentAndLength) {
  std::vector<char> src(70000), fast(70100), naive(70100);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + 7);
  for (int64_t dst_off : {0, 1, 8, 15, 16, 63}) {
    for (int64_t src_off : {0, 3, 64}) {
      for (int64_t n : {0, 1, 255, 256, 257, 4096, 65536 + 17}) {
        std::fill(fast.begin(), fast.end(), 0);
        std::fill(naive.begin(), naive.end(), 0);
        kernels::copy_bytes(fast.data() + dst_off, src.data() + src_off, n, /*streaming=*/true);
        kernels::copy_bytes_reference(naive.data() + dst_off, src.data() + src_off, n);
        EXPECT_EQ(fast, naive) << "dst+" << dst_off << " src+" << src_off << " n " << n;
      }
    }
  }
}

TEST(ShmBackend, EveryCollectiveEveryDtypeMatchesGloo) {
  // 0 to ~6 MiB (as float64): across the one-shot limit (32 KiB) and the 1 MiB chunk, never a multiple.
  for (int world : {2, 3, 4}) {
    run_ranks(world, [](int rank, int w) {
      check_every_collective(rank, w, {0, 1, 7, 1001, 12347}, kDtypes);
    });
  }
}

TEST(ShmBackend, LargeMessagesMatchGloo) {
  for (int world : {2, 3}) {
    run_ranks(world, [](int rank, int w) {
      check_every_collective(rank, w, {300007, 786433}, {at::kDouble, at::kBFloat16});
    });
  }
}

TEST(ShmBackend, FloatSumsAgreeWithGloo) {
  run_ranks(3, [](int rank, int world) {
    BothWorlds worlds(rank, world, "float");
    for (int64_t n : {100, 200003}) {
      at::Tensor a = seeded_randn(rank, {n}), b = a.clone();
      worlds.fast->world_group()->all_reduce_(a, ReduceOp::SUM);
      worlds.gloo->world_group()->all_reduce_(b, ReduceOp::SUM);
      EXPECT_TRUE(at::allclose(a, b, 1e-5, 1e-5)) << n;
    }
  });
}

TEST(ShmBackend, SubGroupsOfA2x2MeshRunConcurrently) {
  run_ranks(4, [](int rank, int world) {
    BothWorlds worlds(rank, world, "mesh");
    // Mesh [[0, 1], [2, 3]]: rows {0, 1}, {2, 3}; columns {0, 2}, {1, 3}.
    const int row = rank / 2, col = rank % 2;
    auto rows = worlds.fast->group({2 * row, 2 * row + 1});
    auto cols = worlds.fast->group({col, col + 2});
    ASSERT_EQ(rows->backend_name(), "dtensor_shm");
    for (int it = 0; it < 50; ++it) {
      const int64_t n = 1 + (it * 7919) % 70000;
      at::Tensor x = at::full({n}, double(rank + it));
      at::Tensor r = x.clone(), c = x.clone();
      rows->all_reduce_(r, ReduceOp::SUM);
      cols->all_reduce_(c, ReduceOp::SUM);
      ASSERT_TRUE(at::equal(r, at::full({n}, double(4 * row + 1 + 2 * it)))) << it;
      ASSERT_TRUE(at::equal(c, at::full({n}, double(2 * col + 2 + 2 * it)))) << it;
      at::Tensor g = at::empty({2 * n}, x.options());
      cols->all_gather_into(g, x);
      ASSERT_EQ(g[0].item<double>(), col + it);
      ASSERT_EQ(g[n].item<double>(), col + 2 + it);
    }
  });
}

TEST(ShmBackend, SizeMismatchIsCaughtInBand) {
  RunOptions options;
  options.expect_all_succeed = false;
  auto errors = run_ranks(2, [](int rank, int world) {
    BothWorlds worlds(rank, world, "mismatch");
    auto group = worlds.fast->world_group();
    at::Tensor x = at::ones({4 - rank, 2});
    group->all_reduce_(x, ReduceOp::SUM);
  }, options);
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("dtensor: all_reduce on group [0, 1] (rank " + std::to_string(r) + " of 2)"),
              std::string::npos) << errors[r];
    EXPECT_NE(errors[r].find("ranks passed tensors of different sizes"), std::string::npos) << errors[r];
  }
  // A dtype the fast path does not carry on one rank only: the same error, not a hang.
  errors = run_ranks(2, [](int rank, int world) {
    BothWorlds worlds(rank, world, "mixed");
    at::Tensor x = at::ones({4}, rank == 0 ? at::kFloat : at::kInt);
    worlds.fast->world_group()->all_reduce_(x, ReduceOp::SUM);
  }, options);
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("different dtypes"), std::string::npos) << errors[r];
}

TEST(ShmBackend, UncoveredDtypesFallBackToGloo) {
  run_ranks(2, [](int rank, int world) {
    BothWorlds worlds(rank, world, "fallback");
    at::Tensor x = at::full({5}, rank + 1, at::kInt);
    worlds.fast->world_group()->all_reduce_(x, ReduceOp::SUM);
    EXPECT_TRUE(at::equal(x, at::full({5}, 3, at::kInt)));
  });
}

TEST(ShmBackend, PeerThatStopsTimesOutNamingIt) {
  RunOptions options;
  options.expect_all_succeed = false;
  options.collective_timeout = std::chrono::milliseconds(1500);
  auto errors = run_ranks(2, [](int rank, int world) {
    InitOptions f{.timeout = std::chrono::milliseconds(1500), .gloo_hostname = "127.0.0.1", .backend = "shm"};
    World fast(c10::make_intrusive<c10d::PrefixStore>("stop", current_world()->store()), rank, world, f);
    auto group = fast.world_group();
    if (rank == 1) throw std::runtime_error("rank 1 stops");
    at::Tensor x = at::ones({8});
    group->all_reduce_(x, ReduceOp::SUM);
  }, options);
  EXPECT_NE(errors[0].find("dtensor: all_reduce on group [0, 1] (rank 0 of 2): rank 1 (group rank 1, pid"),
            std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find("did not arrive within 1500 ms"), std::string::npos) << errors[0];
}

TEST(ShmBackend, KilledRankMakesPeersFailAndLeavesNothingInDevShm) {
  // No launcher (tprun would stop the survivors itself): the survivors must notice on their own.
  auto before = dtensor_segments();
  const int world = 3;
  const ReservedPort port;
  const std::string out = "/tmp/dtensor_shm_kill_" + std::to_string(getpid());
  std::vector<int> pids;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)},
                                           {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "3"},
                                           {"DTENSOR_TIMEOUT_SEC", "5"}};
    for (const auto& [k, v] : port.env(r)) env[k] = v;
    pids.push_back(start_process({bin_path("dist_e2e"), "kill_mid", "1"}, env, out + std::to_string(r)));
  }
  auto killed = wait_process(pids[1], out + "1", 60);
  EXPECT_EQ(killed.exit_code, 128 + 9) << killed.output;  // SIGKILL, as the subprocess harness reports it
  const char* backend = std::getenv("DTENSOR_BACKEND");
  const bool shm = backend == nullptr || std::string(backend) != "gloo";
  for (int r : {0, 2}) {
    auto res = wait_process(pids[r], out + std::to_string(r), 60);
    EXPECT_FALSE(res.timed_out);
    EXPECT_EQ(res.exit_code, 1) << res.output;
    EXPECT_NE(res.output.find("error: dtensor: all_reduce on group [0, 1, 2] (rank " + std::to_string(r) + " of 3)"),
              std::string::npos) << res.output;
    if (shm) EXPECT_NE(res.output.find("rank 1 (group rank 1, pid"), std::string::npos) << res.output;
    // Gloo's own error names an address, not a rank: ours adds what became of each member.
    if (!shm) EXPECT_NE(res.output.find("rank 1: exited (pid " + std::to_string(pids[1])), std::string::npos) << res.output;
  }
  for (const auto& name : dtensor_segments()) EXPECT_TRUE(before.count(name)) << "left behind: /dev/shm/" << name;
}

TEST(ShmBackend, JobKilledDuringGroupCreationLeavesNothingInDevShm) {
  // Rank 1 never joins the new group; rank 0 creates its segment and waits for rank 1 to map it; then the
  // whole job is SIGKILLed (as a launcher or a scheduler would). Nothing may stay in /dev/shm.
  auto before = dtensor_segments();
  const int world = 2;
  const ReservedPort port;
  const std::string out = "/tmp/dtensor_shm_group_kill_" + std::to_string(getpid());
  std::vector<int> pids;
  for (int r = 0; r < world; ++r) {
    std::map<std::string, std::string> env{{"RANK", std::to_string(r)}, {"WORLD_SIZE", std::to_string(world)},
                                           {"LOCAL_RANK", std::to_string(r)}, {"LOCAL_WORLD_SIZE", "2"},
                                           {"DTENSOR_TIMEOUT_SEC", "60"}, {"DTENSOR_BACKEND", ""}};
    for (const auto& [k, v] : port.env(r)) env[k] = v;
    pids.push_back(start_process({bin_path("dist_e2e"), "hang_in_group", "1"}, env, out + std::to_string(r)));
  }
  // Wait (bounded) until rank 0 is inside the group creation, then give it time to create the segment.
  bool creating = false;
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
       !creating && std::chrono::steady_clock::now() < deadline;) {
    std::ifstream f(out + "0");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    creating = text.find("creating group") != std::string::npos;
    if (!creating) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(creating);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  for (int pid : pids) kill(pid, SIGKILL);
  for (int r = 0; r < world; ++r) {
    auto res = wait_process(pids[r], out + std::to_string(r), 30);
    EXPECT_EQ(res.exit_code, 128 + 9) << res.output;
    EXPECT_EQ(res.output.find("group created"), std::string::npos) << res.output;
  }
  for (const auto& name : dtensor_segments()) EXPECT_TRUE(before.count(name)) << "left behind: /dev/shm/" << name;
}

TEST(ShmBackend, GlooCanBeForced) {
  run_ranks(2, [](int rank, int world) {
    InitOptions g{.timeout = std::chrono::milliseconds(20000), .gloo_hostname = "127.0.0.1", .backend = "gloo"};
    World w(c10::make_intrusive<c10d::PrefixStore>("forced", current_world()->store()), rank, world, g);
    EXPECT_NE(w.world_group()->backend_name(), "dtensor_shm");
  });
  InitOptions bad{.backend = "nccl"};
  EXPECT_NE(error_of([&] { World w(c10::make_intrusive<c10d::HashStore>(), 0, 1, bad); })
                .find("InitOptions::backend=nccl is not a backend (auto, gloo or shm)"),
            std::string::npos);
}
