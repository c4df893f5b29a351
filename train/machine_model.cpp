#include "train/machine_model.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

namespace train {
namespace fs = std::filesystem;

namespace {

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

struct Stat {
  double median = 0, lo = 0, hi = 0;
};

Stat measured(const std::function<double()>& once, int runs) {
  std::vector<double> v;
  for (int i = 0; i < runs; ++i) v.push_back(once());
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

std::string range(const char* name, const Stat& s, const char* unit) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s %.3g %s (%.3g-%.3g over 5 runs)", name, s.median, unit, s.lo, s.hi);
  return buf;
}

}  // namespace

dtensor::CostModel fixed_cost_model() {
  dtensor::CostModel m = dtensor::default_cost_model();
  // measure_matmul_gflops(), measure_memory_gbps() and measure_dtensor_op_us() on one thread (tprun gives each rank
  // one) of the development machine, 2026-11-26.
  m.matmul_gflops = 94.0;
  m.memory_gbps = 25.0;
  m.dtensor_op_us = 1.9;
  m.machine_source = "stated: the development machine (AMD EPYC, 1 thread, 2026-11-26); --machine measured times this one";
  return m;
}

std::string machine_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "dtensor" / "machine").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "dtensor" / "machine").string();
  return (fs::temp_directory_path() / "dtensor" / "machine").string();
}

dtensor::CostModel measured_cost_model(at::ScalarType dtype, bool remeasure) {
  dtensor::CostModel m = dtensor::default_cost_model();
  const std::string cpu = cpu_model();
  const int threads = at::get_num_threads();
  std::string key = cpu + "|" + std::to_string(threads) + "|" + c10::toString(dtype);
  const fs::path file = fs::path(machine_cache_dir()) / ("machine-" + std::to_string(std::hash<std::string>()(key)) + ".json");
  nlohmann::json j;
  if (!remeasure && fs::exists(file)) {
    try {
      std::ifstream(file) >> j;
      if (j.value("key", "") != key) j = nlohmann::json();
    } catch (const std::exception&) {
      j = nlohmann::json();  // unreadable: measured again
    }
  }
  const bool cached = !j.is_null();
  if (!cached) {
    const Stat mm = measured([&] { return dtensor::measure_matmul_gflops(dtype); }, 5);
    const Stat mem = measured([] { return dtensor::measure_memory_gbps(); }, 5);
    const Stat op = measured([] { return dtensor::measure_dtensor_op_us(); }, 5);
    char when[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", std::gmtime(&now));
    j = {{"key", key},
         {"matmul_gflops", mm.median},
         {"memory_gbps", mem.median},
         {"dtensor_op_us", op.median},
         {"source", "measured on " + cpu + " with " + std::to_string(threads) + " threads (" + c10::toString(dtype) +
                        ") at " + when + " UTC: " + range("matmul", mm, "GFLOP/s") + ", " +
                        range("memory", mem, "GB/s") + ", " + range("DTensor op", op, "us")}};
    try {
      fs::create_directories(file.parent_path());
      const fs::path tmp = file.string() + ".tmp";
      std::ofstream(tmp) << j.dump(1) << "\n";
      fs::rename(tmp, file);
    } catch (const std::exception&) {
      // no cache: measured again next time
    }
  }
  m.matmul_gflops = j["matmul_gflops"].get<double>();
  m.memory_gbps = j["memory_gbps"].get<double>();
  m.dtensor_op_us = j["dtensor_op_us"].get<double>();
  m.machine_source = j["source"].get<std::string>() + (cached ? " (cached in " + file.string() + ")" : "");
  return m;
}

}  // namespace train
