// The AVX-512 BF16 kernel of dtensor::bf16_packed_linear (packed_linear.h) over a weight packed once at load: compiled
// with -mavx512bf16 alone in its file, entered only after packed_linear.cpp checked the CPU. Raw pointers, no LibTorch.
//
// The packed weight: panels of 64 output columns, each [K / 2][64] pairs (w[n][2p], w[n][2p + 1]) as one 32-bit
// lane, so one 64-byte load is 16 columns' pair p: the B operand of vdpbf16ps as it lies. A register tile of MR rows
// of x by 64 columns keeps 4 * MR fp32 accumulators; each step of k (a pair) loads 4 vectors of the panel and
// broadcasts one pair of each row of x, so each weight byte feeds MR products from L1 and the panel streams from
// memory once, in order, whatever M (a weight as it lies needs a transpose per call: bf16_dot_avx512.cpp instead
// takes dot products, which re-read w from L2 for every 4 rows of x).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace dtensor::detail {
namespace {

constexpr int64_t kPanel = 64;         // output columns per panel
constexpr int64_t kSlicePairs = 1024;  // pairs of k per pass: 256 KB of a panel, which stays in L2 for every tile
constexpr int kMaxRows = 6;            // rows of x per register tile: 24 accumulators + 4 panel vectors
constexpr int64_t kChunkRows = 256;    // rows of x per pass over a panel: their fp32 sums (64 KB) stay in L2 with it

// Prefetches one region (the next slice this thread reads) a few lines per step of the tile, so that memory streams
// it while the FMAs run on the slice in cache.
struct Prefetch {
  const char* next = nullptr;
  const char* end = nullptr;
  int per_step = 0;
  void step() {
    for (int i = 0; i < per_step && next < end; ++i, next += 64) _mm_prefetch(next, _MM_HINT_T1);
  }
};

// y[m][0..64) (+)= sum over pairs p of x[m][2p..2p+1] . panel[p][0..64) for m < MR; `add` keeps y's sums (a later
// slice of k).
template <int MR>
void tile(const uint16_t* x, int64_t ldx, const uint32_t* panel, int64_t pairs, float* y, int64_t ldy, bool add,
          Prefetch& pf) {
  __m512 acc[MR][4];
  for (int m = 0; m < MR; ++m) {
    for (int j = 0; j < 4; ++j) acc[m][j] = add ? _mm512_loadu_ps(y + m * ldy + 16 * j) : _mm512_setzero_ps();
  }
  const auto* xp = reinterpret_cast<const uint32_t*>(x);  // pairs of x; ldx even (K is a multiple of 32)
  for (int64_t p = 0; p < pairs; ++p) {
    const uint32_t* b = panel + p * kPanel;
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16),
                   b2 = (__m512bh)_mm512_loadu_si512(b + 32), b3 = (__m512bh)_mm512_loadu_si512(b + 48);
    pf.step();
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * (ldx / 2) + p]));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], a, b0);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], a, b1);
      acc[m][2] = _mm512_dpbf16_ps(acc[m][2], a, b2);
      acc[m][3] = _mm512_dpbf16_ps(acc[m][3], a, b3);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + m * ldy + 16 * j, acc[m][j]);
  }
}

void tile_rows(int rows, const uint16_t* x, int64_t ldx, const uint32_t* panel, int64_t pairs, float* y, int64_t ldy,
               bool add, Prefetch& pf) {
  switch (rows) {
    case 6: return tile<6>(x, ldx, panel, pairs, y, ldy, add, pf);
    case 5: return tile<5>(x, ldx, panel, pairs, y, ldy, add, pf);
    case 4: return tile<4>(x, ldx, panel, pairs, y, ldy, add, pf);
    case 3: return tile<3>(x, ldx, panel, pairs, y, ldy, add, pf);
    case 2: return tile<2>(x, ldx, panel, pairs, y, ldy, add, pf);
    default: return tile<1>(x, ldx, panel, pairs, y, ldy, add, pf);
  }
}

}  // namespace

// y[m * ldy + n] = bf16(sum_k x[m * K + k] * w[n][k]) for m < M and the columns of panels [b0, b1); K a multiple of
// 32. Each slice of a panel (kSlicePairs pairs) runs under every tile of x's rows (M split evenly into tiles of at
// most kMaxRows) while the next slice streams in. The fp32 sums of a panel gather in this thread's scratch (kChunkRows
// x 64 at most: a long prefill's rows run in chunks over each panel), then round once to bf16 (vcvtneps2bf16: to
// nearest even, as PyTorch's), so no fp32 [M, N] is ever made.
void bf16_packed_rows_avx512(const uint16_t* x, int64_t M, int64_t K, const uint32_t* packed, int64_t b0, int64_t b1,
                             uint16_t* y, int64_t ldy) {
  thread_local std::vector<float> sums(kChunkRows * kPanel);
  float* const scratch = sums.data();
  const int64_t pairs = K / 2;
  const char* const stop = reinterpret_cast<const char*>(packed + b1 * pairs * kPanel);
  for (int64_t b = b0; b < b1; ++b) {
    const uint32_t* panel = packed + b * pairs * kPanel;
    for (int64_t r0 = 0; r0 < M; r0 += kChunkRows) {
      const int64_t R = std::min(kChunkRows, M - r0), tiles = (R + kMaxRows - 1) / kMaxRows;
      const uint16_t* xr = x + r0 * K;
      for (int64_t p0 = 0; p0 < pairs; p0 += kSlicePairs) {
        const int64_t np = std::min(kSlicePairs, pairs - p0);
        const uint32_t* slice = panel + p0 * kPanel;
        // The next slice: the rest of this panel's k, or the next panel's first (contiguous either way).
        const char* next = reinterpret_cast<const char*>(slice + np * kPanel);
        const int64_t next_bytes = std::max<int64_t>(0, std::min<int64_t>(kSlicePairs * kPanel * 4, stop - next));
        const int64_t steps = np * tiles;
        Prefetch pf{next, next + next_bytes, static_cast<int>((next_bytes / 64 + steps - 1) / steps)};
        for (int64_t t = 0, m0 = 0; t < tiles; ++t) {
          const int rows = static_cast<int>(R / tiles + (t < R % tiles ? 1 : 0));
          tile_rows(rows, xr + m0 * K + 2 * p0, K, slice, np, scratch + m0 * kPanel, kPanel, p0 > 0, pf);
          m0 += rows;
        }
      }
      for (int64_t m = 0; m < R; ++m) {
        for (int j = 0; j < 4; ++j) {
          const __m256i v = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(scratch + m * kPanel + 16 * j));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + (r0 + m) * ldy + b * kPanel + 16 * j), v);
        }
      }
    }
  }
}

}  // namespace dtensor::detail
