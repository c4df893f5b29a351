#include "dtensor/core/fast_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <ATen/Config.h>

#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "at::parallel_for would run on one thread: LibTorch uses OpenMP, compile with -fopenmp (cmake/LibTorch.cmake)"
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace dtensor {
namespace detail {
// src/core/bf16_dot_avx512.cpp: rows (<= 4) of x against rows [n0, n1) of w, fp32 sums into y.
void bf16_dot_rows_avx512(const uint16_t* x, int64_t rows, const uint16_t* w, int64_t K, int64_t n0, int64_t n1,
                          float* y, int64_t ldy);
}  // namespace detail

namespace {

bool cpu_has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> flag{[] {
    const char* v = std::getenv("DTENSOR_FAST_KERNELS");
    return !(v && std::strcmp(v, "0") == 0);
  }()};
  return flag;
}

}  // namespace

bool fast_kernels_enabled() { return enabled_flag().load(std::memory_order_relaxed); }

FastKernelsGuard::FastKernelsGuard(bool enabled) : previous_(enabled_flag().exchange(enabled)) {}
FastKernelsGuard::~FastKernelsGuard() { enabled_flag().store(previous_); }

std::optional<at::Tensor> bf16_linear(const at::Tensor& x, const at::Tensor& w, bool fp32_out) {
  constexpr int64_t kMaxRows = 8;
  if (!fast_kernels_enabled() || !cpu_has_avx512_bf16()) return std::nullopt;
  if (x.dim() != 2 || w.dim() != 2 || x.scalar_type() != at::kBFloat16 || w.scalar_type() != at::kBFloat16) return std::nullopt;
  if (!x.device().is_cpu() || !w.device().is_cpu() || x.size(0) > kMaxRows || x.size(0) == 0) return std::nullopt;
  if (x.size(1) != w.size(1) || x.size(1) == 0 || !w.is_contiguous() || x.stride(1) != 1) return std::nullopt;
  if ((x.requires_grad() || w.requires_grad()) && c10::GradMode::is_enabled()) return std::nullopt;
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = w.size(0);
  at::Tensor y = at::empty({M, N}, xc.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  // Threads split w's rows: each streams its own contiguous block of the weight once.
  at::parallel_for(0, N, /*grain_size=*/64, [&](int64_t n0, int64_t n1) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      detail::bf16_dot_rows_avx512(xp + m0 * K, std::min<int64_t>(4, M - m0), wp, K, n0, n1, yp + m0 * N, N);
    }
  });
  return fp32_out ? y : y.to(at::kBFloat16);
}

}  // namespace dtensor
