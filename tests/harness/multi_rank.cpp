#include "harness/multi_rank.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <condition_variable>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

namespace dtensor::testing {

std::vector<std::string> run_ranks(int world_size, const RankBody& body, RunOptions options) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world_size);
  std::mutex mutex;
  std::condition_variable done_cv;
  int done = 0;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        InitOptions init;
        init.timeout = options.collective_timeout;
        auto world = init_process_group(store, rank, world_size, init);
        body(rank, world_size);
        world->world_group()->barrier();  // nobody tears down its groups while a peer still talks
      } catch (const std::exception& e) {
        errors[rank] = e.what();
        if (options.expect_all_succeed) ADD_FAILURE() << "rank " << rank << " of " << world_size << ": " << e.what();
      }
      destroy_process_group();
      std::lock_guard<std::mutex> lock(mutex);
      ++done;
      done_cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    if (!done_cv.wait_for(lock, options.run_timeout, [&] { return done == world_size; })) {
      std::cerr << "dtensor test harness: a world of " << world_size << " did not finish within "
                << options.run_timeout.count() << " ms; aborting instead of hanging" << std::endl;
      std::_Exit(3);
    }
  }
  for (auto& t : threads) t.join();
  return errors;
}

at::Tensor seeded_randn(uint64_t seed, at::IntArrayRef shape, at::ScalarType dtype) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randn(shape, gen, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

bool on_gloo_pass() {
  const char* backend = std::getenv("DTENSOR_BACKEND");
  return backend != nullptr && std::string(backend) == "gloo";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace dtensor::testing
