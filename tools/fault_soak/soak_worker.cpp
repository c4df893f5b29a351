// soak_worker: the job fault_soak injects faults into. One rank of a small job that walks through every
// blocking phase of the library's life, announcing each on stdout as `phase=<name> rank=<r> pid=<p>` so the
// driver can kill or freeze a rank inside the phase it chose:
//
//   start → rendezvous (init_process_group: store, rendezvous, world group) → group (sub-groups) →
//   all_reduce → all_gather → reduce_scatter → all_to_all → broadcast → barrier → shutdown → exit
//
// Each collective phase runs kIterations of its collective, kPace apart, so a fault lands inside it.
// Launched like any rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, DTENSOR_TIMEOUT_SEC, DTENSOR_BACKEND),
// by hand or under tprun. Exit: 0 done; 1 a dtensor::Error (printed as `soak_worker: error: ...`); 3 any
// other exception (an unclear error, which the soak counts against us).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "dtensor/dtensor.h"

namespace {

constexpr int kIterations = 12;
constexpr auto kPace = std::chrono::milliseconds(20);
constexpr int64_t kElements = 1 << 14;  // 64 KiB of floats: several shm chunks when DTENSOR_SHM_CHUNK is small

int g_rank = -1;

void phase(const char* name) {
  std::printf("phase=%s rank=%d pid=%d\n", name, g_rank, static_cast<int>(getpid()));
  std::fflush(stdout);
}

template <typename F>
void repeat(const char* name, F&& body) {
  phase(name);
  for (int i = 0; i < kIterations; ++i) {
    body();
    std::this_thread::sleep_for(kPace);
  }
}

void run() {
  phase("start");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // peers reach the store first, sometimes
  phase("rendezvous");
  auto world = dtensor::init_process_group();
  const int n = world->size(), r = world->rank();

  phase("group");
  std::vector<int> reversed;
  for (int i = n - 1; i >= 0; --i) reversed.push_back(i);
  auto pg = world->group(reversed);  // a second group over every rank, built collectively
  if (n == 4) world->group(r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3});

  auto t = at::full({kElements}, static_cast<float>(r + 1));
  auto gathered = at::empty({n * kElements});
  auto scattered = at::empty({kElements / n});
  std::vector<int64_t> splits(n, kElements / n);
  auto exchanged = at::empty({kElements});
  repeat("all_reduce", [&] { pg->all_reduce_(t, dtensor::ReduceOp::SUM); });
  repeat("all_gather", [&] { pg->all_gather_into(gathered, t); });
  repeat("reduce_scatter", [&] { pg->reduce_scatter_into(scattered, t, dtensor::ReduceOp::SUM); });
  repeat("all_to_all", [&] { pg->all_to_all_single(exchanged, t, splits, splits); });
  repeat("broadcast", [&] { pg->broadcast_(t, 0); });
  repeat("barrier", [&] { pg->barrier(); });

  phase("shutdown");
  pg.reset();
  world.reset();
  dtensor::destroy_process_group();
  phase("exit");
}

}  // namespace

int main() {
  if (const char* rank = std::getenv("RANK")) g_rank = std::atoi(rank);
  try {
    run();
    return 0;
  } catch (const dtensor::Error& e) {
    std::fprintf(stderr, "soak_worker: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "soak_worker: unexpected error: %s\n", e.what());
    return 3;
  }
}
