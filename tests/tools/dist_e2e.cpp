// A small multi-process program the tests launch (through tprun, torchrun --no-python, or by hand):
//
//   dist_e2e ok                 all_reduce and all_gather over the world and a 2-D mesh; prints results
//   dist_e2e die R CODE         rank R exits with CODE before a collective the others enter
//   dist_e2e throw R            rank R throws an uncaught exception before the collective
//   dist_e2e hang R SECONDS     rank R sleeps instead of joining the collective
//   dist_e2e phase R SECONDS    rank R sleeps as `hang`, but in a watchdog::Phase with a long allowance; then joins
//   dist_e2e kill_mid R         all ranks all-reduce 16 MiB tensors in a loop; rank R SIGKILLs itself
//                               200 ms after the first, in the middle of one
//   dist_e2e stop_once R        as stop_mid with SIGSTOP in the first round of a tprun --max-restarts job; in later
//                               rounds (TORCHELASTIC_RESTART_COUNT > 0) as `ok`
//   dist_e2e mismatch           rank r all-reduces a [4 - r, 2] tensor: the ranks disagree on its size
//   dist_e2e hang_in_group R    the ranks create a new same-host group, but rank R sleeps instead; the
//                               others print "creating group" first (rank 0 then waits inside the creation)
//
// Any error reaching main is printed as "error: ..." and exits 1.
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/functional_collectives.h"
#include "dtensor/mesh/watchdog.h"

using namespace dtensor;

int main(int argc, char** argv) {
  std::string scenario = argc > 1 ? argv[1] : "ok";
  if (scenario == "stop_once") {
    const char* round = std::getenv("TORCHELASTIC_RESTART_COUNT");
    scenario = round != nullptr && std::atoi(round) > 0 ? "ok" : "stop_mid";
  }
  int target = argc > 2 ? std::atoi(argv[2]) : -1;
  try {
    auto world = init_process_group();
    int rank = world->rank();
    auto mesh = init_device_mesh("cpu", {world->size()}, {"world"});
    at::Tensor x = at::full({2}, double(rank));
    if (scenario == "ok") {
      at::Tensor sum = all_reduce(x, ReduceOp::SUM, mesh, 0);
      at::Tensor gathered = all_gather(x.narrow(0, 0, 1), 0, mesh, 0);
      std::cout << "sum=" << sum[0].item<double>() << " gathered=";
      for (int64_t i = 0; i < gathered.numel(); ++i) std::cout << (i ? "," : "") << gathered[i].item<double>();
      std::cout << std::endl;
      if (world->size() == 4) {
        auto mesh2 = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
        at::Tensor tp_sum = all_reduce(x, ReduceOp::SUM, mesh2, 1);
        std::cout << "coord=" << (*mesh2.get_coordinate())[0] << "," << (*mesh2.get_coordinate())[1]
                  << " tp_sum=" << tp_sum[0].item<double>() << std::endl;
      }
      return 0;
    }
    if (scenario == "mismatch") {
      all_reduce(at::ones({4 - rank, 2}), ReduceOp::SUM, mesh, 0);
      std::cout << "collective completed" << std::endl;
      return 0;
    }
    if (scenario == "hang_in_group") {
      if (rank == target) std::this_thread::sleep_for(std::chrono::seconds(120));
      std::cout << "creating group" << std::endl;
      InitOptions options;
      options.backend = "shm";
      World late(c10::make_intrusive<c10d::PrefixStore>("late", world->store()), rank, world->size(), options);
      late.world_group();
      std::cout << "group created" << std::endl;
      return 0;
    }
    if (scenario == "kill_mid" || scenario == "stop_mid") {
      at::Tensor big = at::ones({4 << 20});
      mesh.get_group(0).all_reduce_(big, ReduceOp::SUM);  // every group is up before the kill
      if (rank == target) {
        const int signal = scenario == "kill_mid" ? SIGKILL : SIGSTOP;
        std::thread([signal] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          kill(getpid(), signal);
        }).detach();
      }
      for (int i = 0; i < 100000; ++i) mesh.get_group(0).all_reduce_(big, ReduceOp::SUM);
      std::cout << "collective completed" << std::endl;
      return 0;
    }
    if (rank == target) {
      if (scenario == "die") std::_Exit(argc > 3 ? std::atoi(argv[3]) : 3);
      if (scenario == "throw") throw std::logic_error("rank " + std::to_string(rank) + " gives up");  // not caught
      if (scenario == "segfault") std::raise(SIGSEGV);  // as a stray pointer would end it
      if (scenario == "phase") {
        const watchdog::Phase phase("a long test phase", std::chrono::seconds(600));
        std::this_thread::sleep_for(std::chrono::seconds(argc > 3 ? std::atoi(argv[3]) : 60));
      }
      if (scenario == "hang") {
        std::this_thread::sleep_for(std::chrono::seconds(argc > 3 ? std::atoi(argv[3]) : 60));
        return 0;
      }
    }
    all_reduce(x, ReduceOp::SUM, mesh, 0);
    std::cout << "collective completed" << std::endl;
    return 0;
  } catch (const std::runtime_error& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
