// What the benchmark binaries share: their one option and their two ways of timing.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dtensor/mesh/process_group.h"

namespace dtensor::bench {

// `--iters N` (the only option), or `fallback`.
inline int parse_iters(int argc, char** argv, int fallback, const std::string& program) {
  int iters = fallback;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
    else throw std::invalid_argument(program + ": unknown option " + a + " (options: --iters N)");
  }
  return iters;
}

// For calls too short to time one by one: the median over 15 batches of the mean time per call, in µs.
inline double batched_median_us(int iters, const std::function<void()>& fn) {
  for (int i = 0; i < iters / 10 + 10; ++i) fn();
  std::vector<double> batches;
  for (int b = 0; b < 15; ++b) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn();
    batches.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters);
  }
  std::sort(batches.begin(), batches.end());
  return batches[batches.size() / 2];
}

// For collectives: every call starts together after a barrier; the median single call, in µs.
inline double synchronized_median_us(int iters, ProcessGroup& group, const std::function<void()>& fn) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    group.barrier();
    auto t0 = std::chrono::steady_clock::now();
    fn();
    times.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace dtensor::bench
