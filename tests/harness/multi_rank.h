// Multi-rank tests in a few lines, in the spirit of PyTorch's DTensorTestBase / @with_comms:
//
//   TEST(Collectives, AllReduce) {
//     for_each_world({1, 2, 4}, [](int rank, int world) {
//       auto mesh = dtensor::init_device_mesh("cpu", {world});
//       ...EXPECT_...
//     });
//   }
//
// Each rank is a thread with its own dtensor::World over one c10d::HashStore and real Gloo process groups
// on loopback. A rank's exception fails the test with the rank's number; a run that exceeds its bound
// aborts the binary with a message rather than hanging.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <functional>
#include <initializer_list>
#include <string>

#include "dtensor/mesh/process_group.h"

namespace dtensor::testing {

struct RunOptions {
  std::chrono::milliseconds collective_timeout{20000};  // InitOptions::timeout of each rank
  std::chrono::milliseconds run_timeout{120000};        // the whole run
  bool expect_all_succeed = true;  // false: the body's exceptions are returned, not test failures
};

using RankBody = std::function<void(int rank, int world_size)>;

// Runs `body` on ranks 0..world_size-1 concurrently. Returns each rank's exception message ("" if none).
std::vector<std::string> run_ranks(int world_size, const RankBody& body, RunOptions options = {});

inline void for_each_world(std::initializer_list<int> worlds, const RankBody& body, RunOptions options = {}) {
  for (int w : worlds) run_ranks(w, body, options);
}

// Deterministic data without touching the global generator (ranks are threads): the same (seed, shape)
// gives the same tensor on every rank.
at::Tensor seeded_randn(uint64_t seed, at::IntArrayRef shape, at::ScalarType dtype = at::kFloat);

// The message of what `f` throws, "" if it does not throw.
std::string error_of(const std::function<void()>& f);

// True on the Gloo pass (DTENSOR_BACKEND=gloo, scripts/test.sh). Gloo takes milliseconds per small collective here
// (comm_bench: 8 ms for 1 KiB at world 4 on two cores, 18 us on shared memory), so the random sweeps whose point is
// the op rules and placements (the same code on either backend) check a smaller seeded sample of their cases there.
bool on_gloo_pass();

}  // namespace dtensor::testing
