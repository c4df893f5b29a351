// bf16_linear_bench: the decode matmul (dtensor::bf16_linear, dtensor/core/fast_kernels.h) beside PyTorch's bf16
// at::linear (its reference, DTENSOR_FAST_KERNELS off), on one process, the weights streamed from memory (a set of
// copies larger than the caches, cycled so that no call finds its weight in cache), ms per call, for each (K, N) of a
// Llama-3.2-1B layer and each row count; beside them the weight-only int8 matmul (dtensor::int8_weight_linear: the same
// weights in int8, one byte a weight, its own set of the same size) and the rate it reads them at, and the weight-only
// int4 matmul (dtensor::int4_weight_linear, groups of 32 with fp16 scales: Q4_0's 0.5625 bytes a weight) beside
// LibTorch's _weight_int4pack_mm_for_cpu (torchao's CPU int4, groups of 32), and the bf16 matmul on the same weights
// packed at load (dtensor::bf16_packed_linear, dtensor/core/packed_linear.h; 0 where its kernel does not run here
// or the shape cannot be packed). Prints the CPU's
// kernel and row limit first, a table, and a `summary` line per row. Asserts nothing.
//
//   OMP_NUM_THREADS=2 bf16_linear_bench [--iters N] [--rows 1,4,8,16,32,64] [--shapes 2048x8192,...] [--pool-mb MB]
// (--pool-mb 0: one copy of each weight, which stays in cache where it fits: the kernels' compute bound). The default
// pool is 256 MB or twice the L3 the machine reports, the larger: a VM's L3 of 480 MiB held a 256 MB pool, and the
// "streamed" rows read L3, not memory.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "dtensor/core/fast_kernels.h"
#include "dtensor/core/packed_linear.h"

namespace {

double ms_per_call(const std::vector<at::Tensor>& ws, const at::Tensor& x, int iters, bool ours) {
  dtensor::FastKernelsGuard kernels(ours);
  auto call = [&](const at::Tensor& w) { return ours ? *dtensor::bf16_linear(x, w) : at::linear(x, w); };
  call(ws[0]);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call(ws[i % ws.size()]);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double packed_ms_per_call(const std::vector<at::Tensor>& ps, const at::Tensor& x, int iters) {
  auto call = [&](const at::Tensor& p) { return dtensor::bf16_packed_linear(x, p); };
  call(ps[0]);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call(ps[i % ps.size()]);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

double int8_ms_per_call(const std::vector<at::Tensor>& qs, const at::Tensor& scale, const at::Tensor& x, int iters) {
  auto call = [&](const at::Tensor& q) { return *dtensor::int8_weight_linear(x, q, scale); };
  call(qs[0]);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call(qs[i % qs.size()]);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// dtensor::int4_weight_linear (groups of 32, fp16 scales: a GGUF Q4_0 tensor's form) on its own pool of weights.
double int4_ms_per_call(const std::vector<at::Tensor>& qs, const at::Tensor& scale, const at::Tensor& x, int iters) {
  auto call = [&](const at::Tensor& q) { return *dtensor::int4_weight_linear(x, q, scale, at::Tensor(), 32); };
  call(qs[0]);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call(qs[i % qs.size()]);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

// LibTorch's own CPU int4 matmul (what torchao's Int4OpaqueTensor calls), groups of 32, bf16 scales and zeros.
double libtorch_int4_ms_per_call(const std::vector<at::Tensor>& packed, const at::Tensor& scale_zeros,
                                 const at::Tensor& x, int iters) {
  auto call = [&](const at::Tensor& p) { return at::_weight_int4pack_mm_for_cpu(x, p, 32, scale_zeros); };
  call(packed[0]);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call(packed[i % packed.size()]);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

}  // namespace

int main(int argc, char** argv) {
  std::string rows_text = "1,4,8,16,32,64", shapes_text = "2048x8192,8192x2048,2048x2048";
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  int64_t pool_mb = std::max<int64_t>(256, l3 > 0 ? 2 * (l3 >> 20) : 0);
  const int iters = dtensor::bench::parse_iters(argc, argv, 20, "bf16_linear_bench", [&](CLI::App& app) {
    app.add_option("--rows", rows_text, "row counts of x (comma-separated)");
    app.add_option("--shapes", shapes_text, "KxN of w (comma-separated)");
    app.add_option("--pool-mb", pool_mb, "MB of weight copies cycled (0: one copy)")->check(CLI::NonNegativeNumber);
  });
  const std::vector<int64_t> rows = dtensor::bench::int_list(rows_text, "--rows");
  // "2048x8192,8192x2048" -> (K, N) pairs; a bad one: one `error:` line, exit 2.
  std::vector<std::pair<int64_t, int64_t>> shapes;
  std::stringstream in(shapes_text);
  try {
    for (std::string kn; std::getline(in, kn, ',');) {
      const auto x = kn.find('x');
      if (x == std::string::npos) throw tools_cli::UsageError("--shapes: expected KxN, got '" + kn + "'");
      const auto K = tools_cli::parse_number<int64_t>("--shapes", kn.substr(0, x));
      const auto N = tools_cli::parse_number<int64_t>("--shapes", kn.substr(x + 1));
      if (K <= 0 || N <= 0) throw tools_cli::UsageError("--shapes: K and N must be positive, got '" + kn + "'");
      shapes.emplace_back(K, N);
    }
  } catch (const tools_cli::UsageError& e) {
    return tools_cli::usage_error_exit(0, e.what());
  }
  c10::NoGradGuard no_grad;
  const int64_t limit = dtensor::bf16_linear_max_rows();
  std::printf("bf16_linear kernel: %s, up to %ld rows (-1: any); %d threads; weights cycled through %ld MB (L3: %ld MB)\n",
              dtensor::bf16_linear_kernel(), limit == dtensor::kAnyRows ? -1L : static_cast<long>(limit),
              at::get_num_threads(), static_cast<long>(pool_mb), l3 > 0 ? l3 >> 20 : -1L);
  std::printf("| K x N | rows | ours ms | GFLOP/s | PyTorch ms | GFLOP/s | ours / PyTorch | int8 ms | int8 GB/s | "
              "int4 ms | int4 GB/s | LibTorch int4 ms | packed ms | GFLOP/s |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto [K, N] : shapes) {
    const int64_t copies = std::max<int64_t>(1, (pool_mb << 20) / (N * K * 2));
    std::vector<at::Tensor> ws;
    for (int64_t c = 0; c < copies; ++c) ws.push_back(at::randn({N, K}).to(at::kBFloat16));
    const bool packs = dtensor::bf16_packed_linear_available() && dtensor::bf16_packable(N, K);
    std::vector<at::Tensor> ps;
    for (int64_t c = 0; packs && c < copies; ++c) ps.push_back(dtensor::bf16_pack_weight(ws[c]));
    std::vector<at::Tensor> qs;
    for (int64_t c = 0; c < std::max<int64_t>(1, (pool_mb << 20) / (N * K)); ++c) {
      qs.push_back(at::randint(-128, 128, {N, K}, at::kChar));
    }
    const at::Tensor scale = at::rand({N}) * 0.01;
    // int4: N * K / 2 bytes of values and N * K / 32 fp16 scales a weight (Q4_0's bytes, 0.5625 a weight).
    const int64_t int4_bytes = N * K / 2 + N * K / 16;
    std::vector<at::Tensor> q4s, packed;
    for (int64_t c = 0; c < std::max<int64_t>(1, (pool_mb << 20) / int4_bytes); ++c) {
      q4s.push_back(at::randint(0, 256, {N, K / 2}, at::kByte));
    }
    const at::Tensor scale4 = (at::rand({N, K / 32}) * 0.01).to(at::kHalf);
    for (int64_t c = 0; c < std::max<int64_t>(1, (pool_mb << 20) / (N * K / 2)); ++c) {
      packed.push_back(at::_convert_weight_to_int4pack_for_cpu(at::randint(0, 16, {N, K}, at::kInt), 1));
    }
    const at::Tensor scale_zeros = (at::rand({K / 32, N, 2}) * 0.01).to(at::kBFloat16);
    for (int64_t m : rows) {
      const at::Tensor x = at::randn({m, K}).to(at::kBFloat16);
      const bool applies = dtensor::bf16_linear(x, ws[0]).has_value();
      const double theirs = ms_per_call(ws, x, iters, false);
      const double ours = applies ? ms_per_call(ws, x, iters, true) : theirs;
      const bool int8_applies = dtensor::int8_weight_linear(x, qs[0], scale).has_value();
      const double int8 = int8_applies ? int8_ms_per_call(qs, scale, x, iters) : 0.0;
      const bool int4_applies = dtensor::int4_weight_linear(x, q4s[0], scale4, at::Tensor(), 32).has_value();
      const double int4 = int4_applies ? int4_ms_per_call(q4s, scale4, x, iters) : 0.0;
      const double lt_int4 = libtorch_int4_ms_per_call(packed, scale_zeros, x, iters);
      const double pk = packs ? packed_ms_per_call(ps, x, iters) : 0.0;
      const double gflop = 2.0 * m * N * K / 1e9;
      std::printf("| %ld x %ld | %ld | %.3f%s | %.1f | %.3f | %.1f | %.2f | %.3f | %.1f | %.3f | %.1f | %.3f | %.3f | %.1f |\n",
                  static_cast<long>(K), static_cast<long>(N), static_cast<long>(m), ours, applies ? "" : " (PyTorch's)",
                  gflop / ours * 1e3, theirs, gflop / theirs * 1e3, ours / theirs, int8,
                  int8 > 0 ? N * K / int8 / 1e6 : 0.0, int4, int4 > 0 ? int4_bytes / int4 / 1e6 : 0.0, lt_int4, pk,
                  pk > 0 ? gflop / pk * 1e3 : 0.0);
      std::printf("summary k=%ld n=%ld rows=%ld ours_ms=%.3f pytorch_ms=%.3f kernel=%s int8_ms=%.3f int4_ms=%.3f "
                  "libtorch_int4_ms=%.3f packed_ms=%.3f\n", static_cast<long>(K), static_cast<long>(N),
                  static_cast<long>(m), ours, theirs, applies ? dtensor::bf16_linear_kernel() : "pytorch", int8, int4,
                  lt_int4, pk);
    }
  }
  return 0;
}
