// What the benchmark binaries share: their command line, its lists, and their ways of timing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../common/cli.h"
#include "dtensor/mesh/process_group.h"

namespace dtensor::bench {

// The benchmarks' command line (CLI11, tools/common/cli.h): `--iters N` (default `fallback`) and the options `more`
// adds. --help prints the help and exits 0; a bad flag throws tools_cli::UsageError (main: one `error:` line, exit 2).
inline int parse_iters(int argc, char** argv, int fallback, const std::string& program,
                       const std::function<void(CLI::App&)>& more = {}) {
  int iters = fallback;
  CLI::App app;
  tools_cli::configure(app, program);
  app.add_option("--iters", iters, "timed iterations")->check(tools_cli::positive());
  if (more) more(app);
  bool help = false;
  try {
    help = tools_cli::parse(app, std::vector<std::string>(argv + 1, argv + argc));
  } catch (const tools_cli::UsageError& e) {
    std::exit(tools_cli::usage_error_exit(0, e.what()));  // one `error:` line, exit 2 (not an abort)
  }
  if (help) {
    std::fputs(app.help().c_str(), stdout);
    std::exit(0);
  }
  return iters;
}

// A list option's value, "1,8,64" -> {1, 8, 64}; an item that is not a number: one `error:` line naming `flag`, exit 2.
inline std::vector<int64_t> int_list(const std::string& text, const std::string& flag) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  try {
    for (std::string item; std::getline(in, item, ',');) out.push_back(tools_cli::parse_number<int64_t>(flag, item));
  } catch (const tools_cli::UsageError& e) {
    std::exit(tools_cli::usage_error_exit(0, e.what()));
  }
  return out;
}

// The mean time of `iters` calls after one warm-up call, in ms (calls long enough to time together).
inline double mean_ms(int iters, const std::function<void()>& fn) {
  fn();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
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
