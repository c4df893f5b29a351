// The AMX-BF16 kernel of dtensor::bf16_packed_linear (packed_linear.h) over a weight packed once at load: compiled with
// -mamx-tile -mamx-bf16 alone in its file, entered only after packed_linear.cpp checked the CPU and the process holds
// the tile state (fast_kernels.cpp asked Linux for it). Raw pointers, no LibTorch.
//
// The packed layout is AMX's B operand as it lies. A panel is [K / 2][64] 32-bit pairs (w[n][2p], w[n][2p + 1]); the
// 16 pairs p0..p0+15 of columns 16j..16j+15 are 16 rows of 64 bytes, 256 bytes apart: one TILELOADD of a B tile (VNNI
// layout: pairs of k across 16 output columns). x as it lies is the A operand (16 rows of 32 bf16, K * 2 bytes apart),
// so C = x w^T comes out of the tiles untransposed, and neither side is re-laid per call (bf16_dot_amx.cpp computes
// C^T = w x^T from w as it lies, which reads 16 rows of w K * 2 bytes apart a tile and packs x every call).
//
// Tiles: 0, 1 A (16 rows of x each); 2, 3 B (16 columns of the panel each); 4-7 C (fp32 16 x 16, summed over all of K
// before one rounding to bf16).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "amx_tiles.h"

namespace dtensor::detail {
namespace {

constexpr int64_t kPanel = 64;      // output columns per panel
constexpr int64_t kBlockK = 32;     // k per tile product (16 pairs)
constexpr int64_t kChunkBytes = 1 << 20;  // x per pass over the panels (64-256 rows): it stays in L2 under them
constexpr int64_t kAhead = 4;       // blocks of k (4 KB of a panel each) prefetched ahead of the products

using amx::configure_tiles;
using amx::memory_barrier;

// Lines [from, from + bytes) towards L2: a later block of the panel streams from memory while the tiles compute on
// this one (a tile load reads 16 lines 256 bytes apart, a pattern the hardware prefetcher follows poorly).
inline void prefetch(const char* from, int64_t bytes) {
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(from + b, _MM_HINT_T1);
}

// 16 rows of x (A tile 0) times the panel's 64 columns: C tiles 4-7, B tiles 2, 3 in turn. The panel streams once, in
// order (each block of k is 4 KB of it).
void rows16_cols64(const uint16_t* x, int64_t K, const uint32_t* panel, float* c) {
  const int64_t blocks = K / kBlockK, stride = K * 2;
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const uint32_t* b = panel + kb * 16 * kPanel;
    prefetch(reinterpret_cast<const char*>(b + kAhead * 16 * kPanel), 16 * kPanel * 4);
    _tile_loadd(0, x + kb * kBlockK, stride);
    _tile_loadd(2, b, kPanel * 4);
    _tile_dpbf16ps(4, 0, 2);
    _tile_loadd(3, b + 16, kPanel * 4);
    _tile_dpbf16ps(5, 0, 3);
    _tile_loadd(2, b + 32, kPanel * 4);
    _tile_dpbf16ps(6, 0, 2);
    _tile_loadd(3, b + 48, kPanel * 4);
    _tile_dpbf16ps(7, 0, 3);
  }
  _tile_stored(4, c, kPanel * 4);
  _tile_stored(5, c + 16, kPanel * 4);
  _tile_stored(6, c + 32, kPanel * 4);
  _tile_stored(7, c + 48, kPanel * 4);
  memory_barrier();
}

// 32 rows of x (A tiles 0, 1) times 32 columns of the panel from column `col` (B tiles 2, 3): C tiles 4 + 2 r + j.
// Each block of k loads 4 tiles for 4 products (the 64-column pass: 5 for 4).
// The first pass (col 0) prefetches whole blocks of the panel, so that the second finds its columns in L2.
void rows32_cols32(const uint16_t* x, int64_t K, const uint32_t* panel, int64_t col, float* c) {
  const int64_t blocks = K / kBlockK, stride = K * 2;
  const uint16_t* x1 = x + 16 * K;
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const uint32_t* b = panel + kb * 16 * kPanel + col;
    if (col == 0) prefetch(reinterpret_cast<const char*>(b + kAhead * 16 * kPanel), 16 * kPanel * 4);
    _tile_loadd(0, x + kb * kBlockK, stride);
    _tile_loadd(2, b, kPanel * 4);
    _tile_dpbf16ps(4, 0, 2);
    _tile_loadd(3, b + 16, kPanel * 4);
    _tile_dpbf16ps(5, 0, 3);
    _tile_loadd(1, x1 + kb * kBlockK, stride);
    _tile_dpbf16ps(6, 1, 2);
    _tile_dpbf16ps(7, 1, 3);
  }
  _tile_stored(4, c + col, kPanel * 4);
  _tile_stored(5, c + col + 16, kPanel * 4);
  _tile_stored(6, c + 16 * kPanel + col, kPanel * 4);
  _tile_stored(7, c + 16 * kPanel + col + 16, kPanel * 4);
  memory_barrier();
}

// Rows [0, R) of c (fp32, kPanel apart) rounded to bf16 (vcvtneps2bf16: to nearest even, as PyTorch's) into y.
void round_rows(const float* c, int64_t R, uint16_t* y, int64_t ldy) {
  for (int64_t m = 0; m < R; ++m) {
    for (int j = 0; j < 4; ++j) {
      const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(c + m * kPanel + 16 * j));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + m * ldy + 16 * j), v);
    }
  }
}

}  // namespace

// y[m * ldy + n] = bf16(sum_k x[m * K + k] * w[n][k]) for m < M and the columns of panels [b0, b1). x has M rounded up
// to a multiple of 16 rows (the caller pads it with zeros; the padded rows' sums are dropped); K a multiple of 32.
// Rows run in chunks of 1 MB of x (64 rows at K = 8192, 256 at 2048): each stays in L2 while the panels stream under
// it. Within a panel, 16 rows take
// all 64 columns at once; 32 rows take two passes of 32 columns (the second finds the panel in L2). Configures the
// tiles for this thread and releases them.
void bf16_packed_rows_amx(const uint16_t* x, int64_t M, int64_t K, const uint32_t* packed, int64_t b0, int64_t b1,
                          uint16_t* y, int64_t ldy) {
  alignas(64) float c[32 * kPanel];
  const int64_t pairs = K / 2;
  const int64_t chunk_rows = std::clamp<int64_t>((kChunkBytes / (2 * K)) & ~int64_t{31}, 64, 256);
  configure_tiles();
  for (int64_t r0 = 0; r0 < M; r0 += chunk_rows) {
    const int64_t chunk_end = std::min(M, r0 + chunk_rows);
    for (int64_t b = b0; b < b1; ++b) {
      const uint32_t* panel = packed + b * pairs * kPanel;
      for (int64_t m = r0; m < chunk_end;) {
        const int64_t left = chunk_end - m;
        if (left <= 16) {
          rows16_cols64(x + m * K, K, panel, c);
          round_rows(c, left, y + m * ldy + b * kPanel, ldy);
          m += left;
        } else {
          rows32_cols32(x + m * K, K, panel, 0, c);
          rows32_cols32(x + m * K, K, panel, 32, c);
          round_rows(c, std::min<int64_t>(32, left), y + m * ldy + b * kPanel, ldy);
          m += std::min<int64_t>(32, left);
        }
      }
    }
  }
  _tile_release();
}

}  // namespace dtensor::detail
