#include "dtensor/plan/cost_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "dtensor/api/dtensor_api.h"
#include "dtensor/core/error.h"
#include "dtensor/ops/dispatch_options.h"
#include "dtensor/plan/fake_world.h"

namespace dtensor {

std::string replaced_collective(const std::string& collective) {
  if (collective == "fused_all_gather_matmul") return "all_gather";
  if (collective == "fused_matmul_reduce_scatter") return "reduce_scatter";
  return collective;
}

double CostModel::collective_seconds(const std::string& fused_or_plain, int64_t input_bytes, int64_t n) const {
  if (n <= 1) return 0;
  const std::string collective = replaced_collective(fused_or_plain);
  auto it = collectives.find(collective);
  if (it == collectives.end()) it = collectives.find("all_reduce");  // broadcast etc.: the all_reduce numbers
  if (it == collectives.end() || it->second.busbw_gbps <= 0) return 0;
  const double b = static_cast<double>(input_bytes), ranks = static_cast<double>(n);
  double wire = b * (ranks - 1) / ranks;
  if (collective == "all_reduce") wire = 2 * b * (ranks - 1) / ranks;
  if (collective == "all_gather") wire = b * (ranks - 1);
  const double steps = (ranks - 1) / std::max(1.0, static_cast<double>(comm_world - 1));
  return it->second.latency_us * 1e-6 * steps + wire / (it->second.busbw_gbps * 1e9);
}

CostModel default_cost_model() {
  CostModel m;
  // tprun --nproc-per-node 2 comm_bench --min-bytes 1024 --max-bytes 67108864 (shm, idle, 2026-11-26): the 1 KiB
  // median time and the 64 MiB bus bandwidth.
  m.collectives = {{"all_reduce", {1.0, 5.07}},
                   {"all_gather", {0.7, 6.49}},
                   {"reduce_scatter", {0.9, 3.56}},
                   {"all_to_all", {1.0, 3.82}}};
  m.comm_source = "comm_bench (shm, world 2, this machine, 2026-11-26)";
  // Async TP's hand-off of each fused op's pieces to the shm worker with 2 ranks on 2 cores: docs/benchmarks.md's
  // async TP table, default config, +15.4 ms per step over 34 fused ops.
  m.fused_op_overhead_us = 450;
  return m;
}

void load_comm_table(CostModel& model, const std::string& path) {
  std::ifstream in(path);
  DTENSOR_CHECK(in, "dtensor: cannot read comm table '", path, "'");
  // Each table: "# <collective> [(label)]", a header line, then rows: size count iters time(us) algbw busbw.
  std::map<std::string, std::vector<std::pair<double, std::pair<double, double>>>> rows;  // size -> (us, busbw)
  std::string line, current;
  while (std::getline(in, line)) {
    if (const size_t at = line.find("comm_bench: world "); at != std::string::npos) {
      model.comm_world = std::max(2, std::atoi(line.c_str() + at + 18));  // "# dtensor comm_bench: world N, ..."
      continue;
    }
    if (line.rfind("# ", 0) == 0) {
      std::istringstream words(line.substr(2));
      std::string name;
      words >> name;
      current = (name == "all_reduce" || name == "all_gather" || name == "reduce_scatter" || name == "all_to_all") &&
                        !rows.count(name) ? name : "";
      continue;
    }
    if (current.empty()) continue;
    std::istringstream fields(line);
    double size, count, iters, us, algbw, busbw;
    if (fields >> size >> count >> iters >> us >> algbw >> busbw) rows[current].push_back({size, {us, busbw}});
    else if (!line.empty() && line[0] != ' ' && !std::isdigit(static_cast<unsigned char>(line[0]))) current.clear();
  }
  DTENSOR_CHECK(!rows.empty(), "dtensor: no comm_bench table in '", path, "'");
  for (auto& [name, r] : rows) {
    std::sort(r.begin(), r.end());
    model.collectives[name] = {r.front().second.first, r.back().second.second};
  }
  model.comm_source = path;
}

namespace {
// The best of `runs` timings of fn, after one warm-up call.
double best_seconds(const std::function<void()>& fn, int runs) {
  fn();
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}
}  // namespace

double measure_matmul_gflops(at::ScalarType dtype) {
  const int64_t n = 1024;
  at::Tensor a = at::randn({n, n}).to(dtype), b = at::randn({n, n}).to(dtype);
  return 2.0 * n * n * n / best_seconds([&] { at::mm(a, b); }, 3) / 1e9;
}

double measure_memory_gbps() {
  const int64_t n = 4 << 20;
  at::Tensor a = at::randn({n}), b = at::randn({n});
  return 3.0 * static_cast<double>(n) * 4 / best_seconds([&] { at::add(a, b); }, 5) / 1e9;  // two reads, a write
}

double measure_dtensor_op_us() {
  // A block of what a decoder layer's DTensors go through (matmul, an RMS norm, an activation, a residual add, a
  // view), forward and backward, at shapes small enough that the kernels cost little: once on plain tensors, once on
  // replicated DTensors (no communication). The difference over the DTensor operator calls it made is what each
  // call adds: the sharding decision, the wrapping, and the autograd bookkeeping of a DTensor output.
  DeviceMesh mesh("cpu", {2}, {0, 1}, {}, fake_world(2, 0));
  const at::Tensor x0 = at::randn({8, 16}), w0 = at::randn({16, 16});
  auto block = [](const at::Tensor& x, const at::Tensor& w) {
    at::Tensor h = at::matmul(x, w);
    h = h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-6);
    h = at::silu(h) + x;
    h.view({-1}).sum().backward();
  };
  const int reps = 200;
  auto timed = [&](const at::Tensor& x, const at::Tensor& w) {
    return best_seconds([&] { for (int i = 0; i < reps; ++i) block(x, w); }, 5);
  };
  const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const double plain = timed(x, w);
  const at::Tensor dx = distribute_tensor(x0, mesh, {Replicate()}).requires_grad_();
  const at::Tensor dw = distribute_tensor(w0, mesh, {Replicate()}).requires_grad_();
  const int64_t before = dispatch_stats().calls();
  block(dx, dw);
  const int64_t ops = dispatch_stats().calls() - before;
  const double dt = timed(dx, dw);
  return ops > 0 ? std::max(0.0, dt - plain) / (reps * ops) * 1e6 : 0;
}

double record_seconds(const dtensor::CommRecord& r, const CostModel& model) {
  if (r.count == 0) return 0;
  return static_cast<double>(r.count) * model.collective_seconds(r.collective, r.bytes / r.count, r.group_size);
}

StepEstimate estimate_step(const dtensor::RankReport& rank, const CostModel& model) {
  StepEstimate e;
  e.compute_s = model.matmul_gflops > 0 ? rank.matmul_flops / (model.matmul_gflops * 1e9) : 0;
  for (const auto& r : rank.comms) {
    const double s = record_seconds(r, model);
    e.comm_s += s;
    if (replaced_collective(r.collective) != r.collective) {
      e.fused_comm_s += s;
      e.fused_overhead_s += static_cast<double>(r.count) * model.fused_op_overhead_us * 1e-6;
    }
  }
  if (model.memory_gbps > 0) {
    e.other_s = static_cast<double>(rank.allocated_bytes) * model.traffic_per_allocated_byte / (model.memory_gbps * 1e9);
  }
  e.dispatch_s = static_cast<double>(rank.dtensor_ops) * model.dtensor_op_us * 1e-6;
  e.step_s = e.compute_s + e.other_s + e.dispatch_s + e.comm_s + e.fused_overhead_s;
  e.step_overlapped_s = e.compute_s + e.other_s + e.dispatch_s + e.fused_overhead_s + (e.comm_s - e.fused_comm_s) +
                        std::max(0.0, e.fused_comm_s - e.compute_s);
  return e;
}

}  // namespace dtensor
