#include "dtensor/core/fast_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <ATen/Config.h>

#if AT_PARALLEL_OPENMP && !defined(_OPENMP)
#error "at::parallel_for would run on one thread: LibTorch uses OpenMP, compile with -fopenmp (cmake/LibTorch.cmake)"
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace dtensor {
namespace detail {
// src/core/bf16_dot_avx512.cpp: rows (<= 4) of x against rows [n0, n1) of w, fp32 sums into y.
void bf16_dot_rows_avx512(const uint16_t* x, int64_t rows, const uint16_t* w, int64_t K, int64_t n0, int64_t n1,
                          float* y, int64_t ldy);
// src/core/bf16_dot_avx2.cpp: the same with x already in fp32, in the kernel's paired order
// (bf16_rows_to_paired_fp32).
void bf16_dot_rows_avx2(const float* xf, int64_t ldx, int64_t rows, const uint16_t* w, int64_t K, int64_t n0, int64_t n1,
                        float* y, int64_t ldy, const uint16_t* prefetch, int64_t prefetch_bytes);
void bf16_rows_to_paired_fp32(const uint16_t* x, int64_t M, int64_t K, float* out, int64_t ldo);
// src/core/bf16_dot_amx.cpp: x packed into AMX B tiles, then rows [m0, m0 + rows <= 32) of x against rows [n0, n1) of
// w, n1 - n0 a multiple of 32.
bool amx_request_tiles();
int64_t amx_packed_x_elements(int64_t M, int64_t K);
void amx_pack_x(const uint16_t* x, int64_t M, int64_t K, uint16_t* out);
void bf16_dot_rows_amx(const uint16_t* xb, int64_t m0, int64_t rows, const uint16_t* w, int64_t K, int64_t n0,
                       int64_t n1, float* y, int64_t ldy);
}  // namespace detail

namespace {

enum class Kernel { none, amx_bf16, avx512_bf16, avx2_fma };

// The CPU's kernel: AMX-BF16 tiles where the CPU has them and Linux grants this process the tile state (with
// AVX-512 BF16 for single rows and the rows of w that fill no tile), else AVX-512 BF16 dot products, else AVX2 + FMA
// on fp32 (a shift widens bf16).
Kernel cpu_kernel() {
  static const Kernel k = [] {
    const bool avx512_bf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512bf16");
    if (avx512_bf16 && __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
        detail::amx_request_tiles()) {
      return Kernel::amx_bf16;
    }
    if (avx512_bf16) return Kernel::avx512_bf16;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? Kernel::avx2_fma : Kernel::none;
  }();
  return k;
}

// The rows of x up to which each kernel beats PyTorch's bf16 GEMM, measured (docs/benchmarks.md, "bf16 decode on a
// CPU without AVX-512"; tools/bench/bf16_linear_bench.cpp): AVX-512 BF16 at the decode shapes on AMD EPYC with AVX-512
// BF16 (2026-11-27; PyTorch's oneDNN kernel with its own bf16 dot products is close beyond); AVX2 + FMA at any row
// count on AMD EPYC Zen 3 (2026-11-29), where PyTorch's bf16 GEMM runs at ~21 GFLOP/s whatever the rows and this
// kernel at 112-118 from 8 rows on and 131-139 from 64 (0.15-0.19x PyTorch's time from 8 rows on).
// AMX-BF16 to 64 rows on the Intel Xeon with AMX (model 207, 2026-12-01): 0.56-1.08x the time of PyTorch's oneDNN GEMM
// (itself AMX there) from 2 to 64 rows once its output tiles were transposed by shuffles, but for one shape (2048 x
// 3072 at 48 rows: 1.3-2.3x, not understood); 0.58-1.20x at 128 (each 32-row pass over a block of w finds it in L2,
// but the packed x is read again): no gain to count on past 64.
int64_t max_rows(Kernel k) {
  switch (k) {
    case Kernel::amx_bf16: return 64;
    case Kernel::avx512_bf16: return 8;
    case Kernel::avx2_fma: return kAnyRows;
    case Kernel::none: return 0;
  }
  return 0;
}

// Rows of w per block of either kernel: a block (~128 KB, L2's share) is read from memory once and every 4-row
// chunk of x runs over it while it is in cache, so w streams once whatever the number of rows (even, >= 2).
int64_t block_rows(int64_t K) { return std::max<int64_t>(2, (int64_t{128} << 10) / (2 * K)) & ~int64_t{1}; }

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

const char* bf16_linear_kernel() {
  if (!fast_kernels_enabled()) return "off";
  switch (cpu_kernel()) {
    case Kernel::amx_bf16: return "amx_bf16";
    case Kernel::avx512_bf16: return "avx512_bf16";
    case Kernel::avx2_fma: return "avx2_fma";
    case Kernel::none: return "none";
  }
  return "none";
}

int64_t bf16_linear_max_rows() { return fast_kernels_enabled() ? max_rows(cpu_kernel()) : 0; }

namespace {

constexpr int64_t kSliceRows = 256;

// y [M, N] fp32 = x [M, K] bf16 times w [N, K] bf16 transposed, by the AVX2 kernel (bf16_dot_avx2.cpp).
void avx2_linear(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* wp, int64_t N, float* yp) {
  const int64_t ldx = K + 16;  // rows 64 bytes apart from a multiple of 4 KB: other L1 sets (bf16_dot_avx2.cpp)
  // Once: x in fp32, in the kernel's order, 64-byte aligned (LibTorch's allocator) so that no 32-byte load of it
  // straddles two cache lines.
  const at::Tensor xf = at::empty({M, ldx}, at::TensorOptions().dtype(at::kFloat));
  detail::bf16_rows_to_paired_fp32(xp, M, K, xf.data_ptr<float>(), ldx);
  const float* xfp = xf.data_ptr<float>();
  const int64_t rows = block_rows(K), blocks = (N + rows - 1) / rows;
  // Threads split the blocks of w's rows; every 4-row chunk of x runs over a block while it is in cache.
  at::parallel_for(0, blocks, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * rows, n1 = std::min(N, n0 + rows);
      // While the passes over this block compute, the next block of this thread's range (its rows [n1, next_end))
      // streams into L2, a share of it per pass.
      const int64_t next_end = b + 1 < b1 ? std::min(N, n1 + rows) : n1, passes = (M + 3) / 4;
      const int64_t next_rows = next_end - n1;
      for (int64_t m0 = 0, p = 0; m0 < M; m0 += 4, ++p) {
        const int64_t r0 = n1 + next_rows * p / passes, r1 = n1 + next_rows * (p + 1) / passes;
        detail::bf16_dot_rows_avx2(xfp + m0 * ldx, ldx, std::min<int64_t>(4, M - m0), wp, K, n0, n1, yp + m0 * N, N,
                                   wp + r0 * K, (r1 - r0) * K * 2);
      }
    }
  });
}

// y [M, N] fp32 = x [M, K] bf16 times w [N, K] bf16 transposed, by the AVX-512 BF16 kernel (bf16_dot_avx512.cpp):
// threads split w into blocks of block_rows(K) rows, and every 4-row chunk of x runs over a block while it is in cache,
// so w streams from memory once whatever the number of rows (a pass of each chunk over the whole of w read it M / 4
// times).
void avx512_linear(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* wp, int64_t N, float* yp) {
  const int64_t rows = block_rows(K), blocks = (N + rows - 1) / rows;
  at::parallel_for(0, blocks, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * rows, n1 = std::min(N, n0 + rows);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        detail::bf16_dot_rows_avx512(xp + m0 * K, std::min<int64_t>(4, M - m0), wp, K, n0, n1, yp + m0 * N, N);
      }
    }
  });
}

// Rows of x from which the AMX kernel runs (below: the AVX-512 BF16 kernel, whose dot products waste nothing on a
// single row).
constexpr int64_t kAmxMinRows = 2;

// y [M, N] fp32 = x [M, K] bf16 times w [N, K] bf16 transposed, by the AMX kernel (bf16_dot_amx.cpp): x packed into B
// tiles once; threads split w into blocks of whole 32-row tile groups, every 32-row chunk of x runs over a block while
// it is in cache; the last rows of w that fill no 32-row group go through the AVX-512 kernel.
void amx_linear(const uint16_t* xp, int64_t M, int64_t K, const uint16_t* wp, int64_t N, float* yp) {
  const at::Tensor xb = at::empty({detail::amx_packed_x_elements(M, K)}, at::TensorOptions().dtype(at::kBFloat16));
  auto* xbp = reinterpret_cast<uint16_t*>(xb.data_ptr<at::BFloat16>());
  detail::amx_pack_x(xp, M, K, xbp);
  const int64_t rows = std::max<int64_t>(32, block_rows(K) & ~int64_t{31}), blocks = (N + rows - 1) / rows;
  at::parallel_for(0, blocks, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * rows, n1 = std::min(N, n0 + rows), tiled = n0 + (n1 - n0) / 32 * 32;
      for (int64_t m0 = 0; m0 < M && tiled > n0; m0 += 32) {
        detail::bf16_dot_rows_amx(xbp, m0, std::min<int64_t>(32, M - m0), wp, K, n0, tiled, yp, N);
      }
      for (int64_t m0 = 0; m0 < M && tiled < n1; m0 += 4) {
        detail::bf16_dot_rows_avx512(xp + m0 * K, std::min<int64_t>(4, M - m0), wp, K, tiled, n1, yp + m0 * N, N);
      }
    }
  });
}

}  // namespace

std::optional<at::Tensor> bf16_linear(const at::Tensor& x, const at::Tensor& w, bool fp32_out) {
  const Kernel kernel = cpu_kernel();
  if (!fast_kernels_enabled() || kernel == Kernel::none) return std::nullopt;
  if (x.dim() != 2 || w.dim() != 2 || x.scalar_type() != at::kBFloat16 || w.scalar_type() != at::kBFloat16) return std::nullopt;
  if (!x.device().is_cpu() || !w.device().is_cpu() || x.size(0) > max_rows(kernel) || x.size(0) == 0) return std::nullopt;
  if (x.size(1) != w.size(1) || x.size(1) == 0 || !w.is_contiguous() || x.stride(1) != 1) return std::nullopt;
  if ((x.requires_grad() || w.requires_grad()) && c10::GradMode::is_enabled()) return std::nullopt;
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = w.size(0);
  at::Tensor y = at::empty({M, N}, xc.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  if (kernel == Kernel::avx2_fma) {
    // At most kSliceRows rows of x per pass over w: x's fp32 copy stays small (a long prefill's rows would need
    // M * K * 4 bytes at once), and with 256 rows every byte of w already feeds 256 FMAs.
    for (int64_t s0 = 0; s0 < M; s0 += kSliceRows) {
      avx2_linear(xp + s0 * K, std::min(kSliceRows, M - s0), K, wp, N, yp + s0 * N);
    }
    return fp32_out ? y : y.to(at::kBFloat16);
  }
  if (kernel == Kernel::amx_bf16 && M >= kAmxMinRows) {
    amx_linear(xp, M, K, wp, N, yp);
  } else {
    avx512_linear(xp, M, K, wp, N, yp);
  }
  return fp32_out ? y : y.to(at::kBFloat16);
}

}  // namespace dtensor
