#include "dtensor/core/fast_kernels.h"

#include "core/filled_linear.h"

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
// src/core/int8_widen_avx2.cpp: n int8 values to bf16 (exact).
void int8_to_bf16(const int8_t* q, int64_t n, uint16_t* out);
// src/core/int8_dot_avx2.cpp: rows (<= 4) of x in fp32 against int8 rows [n0, n1) of q, fp32 sums into y.
void int8_dot_rows_avx2(const float* xf, int64_t rows, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y,
                        int64_t ldy);
// src/core/int8_dot_avx512.cpp: the same, 16 weights a vector.
void int8_dot_rows_avx512(const float* xf, int64_t rows, const int8_t* q, int64_t K, int64_t n0, int64_t n1, float* y,
                          int64_t ldy);
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
// CPU without AVX-512"; tools/bench/bf16_linear_bench.cpp): AVX-512 BF16 to 16 rows on AMD EPYC Zen 5 (family 26,
// 2026-12-02) once 4-row chunks ran as 4 x 4 register tiles (bf16_dot_avx512.cpp): 0.6-1.0x oneDNN's time at 8 and
// 16 rows, level at 24-32 (and a whole decode step at batch 32 5-8% slower with it), 1.1-1.5x at 64 (the limit was 8
// rows with one dot product per pair of rows); AVX2 + FMA at any row
// count on AMD EPYC Zen 3 (2026-11-29), where PyTorch's bf16 GEMM runs at ~21 GFLOP/s whatever the rows and this
// kernel at 112-118 from 8 rows on and 131-139 from 64 (0.15-0.19x PyTorch's time from 8 rows on).
// AMX-BF16 to 64 rows on the Intel Xeon with AMX (model 207, 2026-12-01): 0.56-1.08x the time of PyTorch's oneDNN GEMM
// (itself AMX there) from 2 to 64 rows once its output tiles were transposed by shuffles, but for one shape (2048 x
// 3072 at 48 rows: 1.3-2.3x, not understood); 0.58-1.20x at 128 (each 32-row pass over a block of w finds it in L2,
// but the packed x is read again): no gain to count on past 64.
int64_t max_rows(Kernel k) {
  switch (k) {
    case Kernel::amx_bf16: return 64;
    case Kernel::avx512_bf16: return 16;
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

// Rows of x from which the AMX kernel runs (below: the AVX-512 BF16 kernel, whose dot products waste nothing on a
// single row).
constexpr int64_t kAmxMinRows = 2;

// x [M, K] bf16 made ready for one kernel once per call: AVX2 reads it in fp32 in its paired order
// (bf16_rows_to_paired_fp32), AMX in packed B tiles (amx_pack_x), AVX-512 as it is.
struct PreparedX {
  Kernel kernel = Kernel::none;
  const uint16_t* x = nullptr;
  int64_t M = 0, K = 0;
  at::Tensor buffer;
  const float* xf = nullptr;  // avx2_fma
  int64_t ldx = 0;
  const uint16_t* xb = nullptr;  // amx_bf16
};

PreparedX prepare_x(Kernel kernel, const uint16_t* xp, int64_t M, int64_t K) {
  if (kernel == Kernel::amx_bf16 && M < kAmxMinRows) kernel = Kernel::avx512_bf16;
  PreparedX p;
  p.kernel = kernel, p.x = xp, p.M = M, p.K = K;
  if (kernel == Kernel::avx2_fma) {
    p.ldx = K + 16;  // rows 64 bytes apart from a multiple of 4 KB: other L1 sets (bf16_dot_avx2.cpp)
    // 64-byte aligned (LibTorch's allocator) so that no 32-byte load of it straddles two cache lines.
    p.buffer = at::empty({M, p.ldx}, at::TensorOptions().dtype(at::kFloat));
    detail::bf16_rows_to_paired_fp32(xp, M, K, p.buffer.data_ptr<float>(), p.ldx);
    p.xf = p.buffer.data_ptr<float>();
  } else if (kernel == Kernel::amx_bf16) {
    p.buffer = at::empty({detail::amx_packed_x_elements(M, K)}, at::TensorOptions().dtype(at::kBFloat16));
    auto* xb = reinterpret_cast<uint16_t*>(p.buffer.data_ptr<at::BFloat16>());
    detail::amx_pack_x(xp, M, K, xb);
    p.xb = xb;
  }
  return p;
}

// Rows of w per block: a block (~128 KB, L2's share) is read from memory once and every chunk of x (4 rows; AMX: 32)
// runs over it while it is in cache, so w streams once whatever the number of rows. AMX: whole 32-row tile groups.
int64_t rows_per_block(Kernel kernel, int64_t K) {
  return kernel == Kernel::amx_bf16 ? std::max<int64_t>(32, block_rows(K) & ~int64_t{31}) : block_rows(K);
}

// y[m * ldy + n] (fp32) = x's row m . w's row n for every row of x and the `rows` rows of one block w [rows, K]. AVX2:
// while the passes over this block compute, [prefetch, prefetch + prefetch_bytes) (the next block) streams into L2, a
// share per pass. AMX: the last rows that fill no 32-row group through the AVX-512 kernel.
void run_block(const PreparedX& p, const uint16_t* w, int64_t rows, float* y, int64_t ldy, const uint16_t* prefetch,
               int64_t prefetch_bytes) {
  const int64_t M = p.M, K = p.K;
  switch (p.kernel) {
    case Kernel::avx2_fma: {
      const int64_t passes = (M + 3) / 4;
      for (int64_t m0 = 0, i = 0; m0 < M; m0 += 4, ++i) {
        const int64_t b0 = prefetch_bytes * i / passes / 64 * 64, b1 = prefetch_bytes * (i + 1) / passes / 64 * 64;
        detail::bf16_dot_rows_avx2(p.xf + m0 * p.ldx, p.ldx, std::min<int64_t>(4, M - m0), w, K, 0, rows, y + m0 * ldy,
                                   ldy, prefetch + b0 / 2, b1 - b0);
      }
      return;
    }
    case Kernel::amx_bf16: {
      const int64_t tiled = rows / 32 * 32;
      for (int64_t m0 = 0; m0 < M && tiled > 0; m0 += 32) {
        detail::bf16_dot_rows_amx(p.xb, m0, std::min<int64_t>(32, M - m0), w, K, 0, tiled, y, ldy);
      }
      for (int64_t m0 = 0; m0 < M && tiled < rows; m0 += 4) {
        detail::bf16_dot_rows_avx512(p.x + m0 * K, std::min<int64_t>(4, M - m0), w, K, tiled, rows, y + m0 * ldy, ldy);
      }
      return;
    }
    case Kernel::avx512_bf16:
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        detail::bf16_dot_rows_avx512(p.x + m0 * K, std::min<int64_t>(4, M - m0), w, K, 0, rows, y + m0 * ldy, ldy);
      }
      return;
    case Kernel::none:
      return;
  }
}

// y [M, N] fp32 = x [M, K] bf16 times w [N, K] bf16 transposed: threads split w into blocks (rows_per_block), every
// chunk of x runs over a block while it is in cache (a pass of each chunk over the whole of w read it M / 4 times).
void blocked_linear(Kernel kernel, const uint16_t* xp, int64_t M, int64_t K, const uint16_t* wp, int64_t N, float* yp) {
  const PreparedX p = prepare_x(kernel, xp, M, K);
  const int64_t rows = rows_per_block(p.kernel, K), blocks = (N + rows - 1) / rows;
  at::parallel_for(0, blocks, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * rows, n1 = std::min(N, n0 + rows);
      const int64_t next_end = b + 1 < b1 ? std::min(N, n1 + rows) : n1;  // this thread's next block
      run_block(p, wp + n0 * K, n1 - n0, yp + n0, N, wp + n1 * K, (next_end - n1) * K * 2);
    }
  });
}

// The same with weights made block by block: each thread has fill(n0, n1, out) write rows [n0, n1) of w in bf16 into
// a buffer that stays in L2, then runs the block's kernel on it; w, as it is stored (int8, int4), streams from memory
// once.
void filled_blocked_linear(Kernel kernel, const uint16_t* xp, int64_t M, int64_t K, int64_t N,
                           const detail::BlockFill& fill, float* yp) {
  const PreparedX p = prepare_x(kernel, xp, M, K);
  const int64_t rows = rows_per_block(p.kernel, K), blocks = (N + rows - 1) / rows;
  at::parallel_for(0, blocks, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    const at::Tensor block = at::empty({rows * K}, at::TensorOptions().dtype(at::kBFloat16));
    auto* wb = reinterpret_cast<uint16_t*>(block.data_ptr<at::BFloat16>());
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * rows, n1 = std::min(N, n0 + rows);
      fill(n0, n1, wb);
      run_block(p, wb, n1 - n0, yp + n0, N, nullptr, 0);
    }
  });
}

// int8 weights widened to bf16, exact (|q| <= 128 has 8 significant bits).
void blocked_int8_linear(Kernel kernel, const uint16_t* xp, int64_t M, int64_t K, const int8_t* qp, int64_t N, float* yp) {
  filled_blocked_linear(kernel, xp, M, K, N, [&](int64_t n0, int64_t n1, uint16_t* out) {
    detail::int8_to_bf16(qp + n0 * K, (n1 - n0) * K, out);
  }, yp);
}

// Rows of x up to which int8 weights stream through the fused kernel (int8_dot_avx*.cpp) rather than being widened
// into a buffer for the bf16 kernels: measured on the Intel Xeon with AMX (model 207, 2026-12-02; bf16_linear_bench,
// docs/benchmarks.md "Weight-only int8"): at 4 rows the fused AVX-512 loop took 1.5 / 1.8 / 0.30 ms on the 1B's
// three shapes against the widened AMX path's 2.7 / 2.6 / 0.68; at 8 rows they were even (2.6 / 4.3 / 0.48 against
// 2.3 / 2.8 / 0.60). Not measured on the other CPU kinds.
constexpr int64_t kInt8FusedMaxRows = 4;

// y [M <= kInt8FusedMaxRows, N] fp32 = x (in fp32, contiguous) times q^T by the fused kernel (AVX-512 where the CPU
// has it, else AVX2): threads split q into blocks of ~128 KB, every 4-row chunk of x runs over a block while it is in
// cache.
void fused_int8_linear(Kernel kernel, const float* xfp, int64_t M, int64_t K, const int8_t* qp, int64_t N, float* yp) {
  const bool avx512 = kernel == Kernel::amx_bf16 || kernel == Kernel::avx512_bf16;  // both imply AVX-512F
  const int64_t rows = std::max<int64_t>(1, (int64_t{128} << 10) / K), blocks = (N + rows - 1) / rows;
  at::parallel_for(0, blocks, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * rows, n1 = std::min(N, n0 + rows);
      for (int64_t m0 = 0; m0 < M; m0 += 4) {
        const int64_t r = std::min<int64_t>(4, M - m0);
        if (avx512) {
          detail::int8_dot_rows_avx512(xfp + m0 * K, r, qp, K, n0, n1, yp + m0 * N, N);
        } else {
          detail::int8_dot_rows_avx2(xfp + m0 * K, r, qp, K, n0, n1, yp + m0 * N, N);
        }
      }
    }
  });
}

// The checks both linears share: bf16 x [M, K] (contiguous rows) on the CPU, a weight [N, K] contiguous, no autograd.
bool takes(const at::Tensor& x, const at::Tensor& w, at::ScalarType w_dtype) {
  if (!fast_kernels_enabled() || cpu_kernel() == Kernel::none) return false;
  if (x.dim() != 2 || w.dim() != 2 || x.scalar_type() != at::kBFloat16 || w.scalar_type() != w_dtype) return false;
  if (!x.device().is_cpu() || !w.device().is_cpu() || x.size(0) == 0) return false;
  if (x.size(1) != w.size(1) || x.size(1) == 0 || !w.is_contiguous() || x.stride(1) != 1) return false;
  return !((x.requires_grad() || w.requires_grad()) && c10::GradMode::is_enabled());
}

}  // namespace

std::optional<at::Tensor> bf16_linear(const at::Tensor& x, const at::Tensor& w, bool fp32_out) {
  const Kernel kernel = cpu_kernel();
  if (!takes(x, w, at::kBFloat16) || x.size(0) > max_rows(kernel)) return std::nullopt;
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = w.size(0);
  at::Tensor y = at::empty({M, N}, xc.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  float* yp = y.data_ptr<float>();
  // At most kSliceRows rows of x per pass over w: x's prepared copy stays small (a long prefill's rows would need
  // M * K * 4 bytes at once), and with 256 rows every byte of w already feeds 256 FMAs.
  for (int64_t s0 = 0; s0 < M; s0 += kSliceRows) {
    blocked_linear(kernel, xp + s0 * K, std::min(kSliceRows, M - s0), K, wp, N, yp + s0 * N);
  }
  return fp32_out ? y : y.to(at::kBFloat16);
}

std::optional<at::Tensor> int8_weight_linear(const at::Tensor& x, const at::Tensor& q, const at::Tensor& scale) {
  if (!takes(x, q, at::kChar) || scale.dim() != 1 || scale.size(0) != q.size(0) || !scale.device().is_cpu()) {
    return std::nullopt;
  }
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = q.size(0);
  at::Tensor y = at::empty({M, N}, xc.options().dtype(at::kFloat));
  const auto* xp = reinterpret_cast<const uint16_t*>(xc.data_ptr<at::BFloat16>());
  const int8_t* qp = q.data_ptr<int8_t>();
  float* yp = y.data_ptr<float>();
  // Every row count: the alternative is not PyTorch's bf16 GEMM (bf16_linear's row limits) but widening the whole of
  // q first. A few rows: the fused kernel; more: q widened block by block for the bf16 kernels, in slices of
  // kSliceRows rows as above (each slice widens q again: at 256 rows that is noise).
  if (M <= kInt8FusedMaxRows) {
    const at::Tensor xf = xc.to(at::kFloat);  // exact
    fused_int8_linear(cpu_kernel(), xf.data_ptr<float>(), M, K, qp, N, yp);
  } else {
    for (int64_t s0 = 0; s0 < M; s0 += kSliceRows) {
      blocked_int8_linear(cpu_kernel(), xp + s0 * K, std::min(kSliceRows, M - s0), K, qp, N, yp + s0 * N);
    }
  }
  // One rounding, after the scale: bf16(scale[n] * sum_k x[m][k] q[n][k]).
  return y.mul_(scale.to(at::kFloat)).to(at::kBFloat16);
}

namespace detail {
bool bf16_linear_filled(const at::Tensor& x, int64_t N, const BlockFill& fill, float* y) {
  const Kernel kernel = cpu_kernel();
  if (!fast_kernels_enabled() || kernel == Kernel::none || x.dim() != 2 || x.scalar_type() != at::kBFloat16 ||
      !x.device().is_cpu() || x.size(0) == 0 || !x.is_contiguous()) {
    return false;
  }
  const int64_t M = x.size(0), K = x.size(1);
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  for (int64_t s0 = 0; s0 < M; s0 += kSliceRows) {  // as bf16_linear (each slice fills w again)
    filled_blocked_linear(kernel, xp + s0 * K, std::min(kSliceRows, M - s0), K, N, fill, y + s0 * N);
  }
  return true;
}
}  // namespace detail

}  // namespace dtensor
