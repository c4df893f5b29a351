// The AMX-BF16 inner loop of dtensor::bf16_linear (fast_kernels.h): compiled with -mamx-tile -mamx-bf16 alone in its
// file, entered only after fast_kernels.cpp checked the CPU and the kernel granted this process the tile state. Raw
// pointers, no LibTorch.
//
// y = x w^T with w [N, K] as it lies in memory, no packing of the weights: the roles are swapped, C^T = w x^T. A tile
// of 16 rows of w (32 bf16 each, K * 2 bytes apart) is exactly AMX's A operand; x, the small side, is packed once per
// call into B tiles (VNNI: pairs of k interleaved across 16 columns of x's rows). Each TDPBF16PS then adds 16 rows of w
// times 32 of k times up to 16 rows of x into a 16 x 16 fp32 tile of C^T, and w streams through the tiles once.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "amx_tiles.h"

namespace dtensor::detail {
namespace {

constexpr int64_t kChunk = 32;              // k per tile row of A (64 bytes of bf16)
constexpr int64_t kPackedTile = 16 * 32;    // bf16 per packed B tile: 16 pairs of k x 16 rows of x x 2

// Tiles (amx_tiles.h: all 16 rows x 64 bytes): A 0, 1 (16 rows of w each), B 2, 3 (16 rows of x each), C 4-7 (rows
// 16 a.. of the group of w times x's block b in tile 4 + a + 2 b).
using amx::configure_tiles;
using amx::memory_barrier;

// C^T for 32 rows of w (A tiles 0, 1 from rows n and n + 16) against one or two packed 16-row blocks of x (B tiles
// 2, 3): tiles 4, 5 (rows n.., n+16.. x block 0) and 6, 7 (x block 1), stored to c [4][16][16].
template <bool TwoBlocks>
void group32(const uint16_t* xb0, const uint16_t* xb1, const uint16_t* w, int64_t K, int64_t n, float* c) {
  const int64_t full = K / kChunk, stride = K * 2;
  const uint16_t* r0 = w + n * K;
  const uint16_t* r1 = w + (n + 16) * K;
  _tile_zero(4);
  _tile_zero(5);
  if constexpr (TwoBlocks) {
    _tile_zero(6);
    _tile_zero(7);
  }
  // A tiles from a0 and a1 (16 rows of w each, a_stride bytes apart) times x's B tile(s) of k's chunk `k`.
  auto accumulate = [&](const uint16_t* a0, const uint16_t* a1, int64_t a_stride, int64_t k) {
    _tile_loadd(0, a0, a_stride);
    _tile_loadd(1, a1, a_stride);
    _tile_loadd(2, xb0 + k * kPackedTile, 64);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 1, 2);
    if constexpr (TwoBlocks) {
      _tile_loadd(3, xb1 + k * kPackedTile, 64);
      _tile_dpbf16ps(6, 0, 3);
      _tile_dpbf16ps(7, 1, 3);
    }
  };
  // While this group's tiles compute, the next 32 rows of w (contiguous, 64 K bytes) stream into L2 in order, a
  // share per step: a tile load reads 16 rows at once, 32 streams that the hardware prefetcher does not follow.
  const char* next = reinterpret_cast<const char*>(w + (n + 32) * K);
  const int64_t share = (32 * stride / std::max<int64_t>(full, 1) + 63) & ~int64_t{63};
  for (int64_t k = 0; k < full; ++k) {
    for (int64_t b = 0; b < share; b += 64) _mm_prefetch(next + k * share + b, _MM_HINT_T1);
    accumulate(r0 + k * kChunk, r1 + k * kChunk, stride, k);
  }
  if (K % kChunk) {
    // The last k < 32 of each row, zero-padded (a tile load past a row's end would read the next row, or past w).
    alignas(64) uint16_t tail[32][kChunk] = {};
    for (int r = 0; r < 32; ++r) std::memcpy(tail[r], w + (n + r) * K + full * kChunk, (K % kChunk) * 2);
    memory_barrier();
    accumulate(tail[0], tail[16], 64, full);
  }
  _tile_stored(4, c, 64);
  _tile_stored(5, c + 256, 64);
  if constexpr (TwoBlocks) {
    _tile_stored(6, c + 512, 64);
    _tile_stored(7, c + 768, 64);
  }
  memory_barrier();
}

// out[c * ld + r] = t[r][c] for the first `valid` columns c of a 16 x 16 fp32 tile t (rows 64 bytes apart): the AVX-512
// transpose (unpack pairs, shuffle quads, then 128-bit lanes) instead of 256 scalar gathers a tile, which cost as much
// as the tile's products at K = 2048.
void store_transposed(const float* t, int64_t valid, float* out, int64_t ld) {
  __m512 r[16], s[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_load_ps(t + 16 * i);
  for (int i = 0; i < 8; ++i) {  // lane j of s[2i]: r[2i][4j], r[2i+1][4j], r[2i][4j+1], r[2i+1][4j+1]
    s[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    s[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // lane j of r[4i + q]: column 4j + q of rows 4i .. 4i + 3
    r[4 * i] = _mm512_shuffle_ps(s[4 * i], s[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(s[4 * i], s[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(s[4 * i + 1], s[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(s[4 * i + 1], s[4 * i + 3], 0xEE);
  }
  for (int q = 0; q < 4; ++q) {  // column 4j + q: lane j of r[q], r[4 + q], r[8 + q], r[12 + q]
    const __m512 x0 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0x44), x1 = _mm512_shuffle_f32x4(r[q], r[4 + q], 0xEE);
    const __m512 y0 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0x44), y1 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], 0xEE);
    const __m512 col[4] = {_mm512_shuffle_f32x4(x0, y0, 0x88), _mm512_shuffle_f32x4(x0, y0, 0xDD),
                           _mm512_shuffle_f32x4(x1, y1, 0x88), _mm512_shuffle_f32x4(x1, y1, 0xDD)};
    for (int j = 0; j < 4; ++j) {
      if (4 * j + q < valid) _mm512_storeu_ps(out + (4 * j + q) * ld, col[j]);
    }
  }
}

}  // namespace

// Asks Linux for the AMX tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), once per process; a
// process that has it may use the tiles on every thread. False: the kernel refused (or is too old), no AMX.
bool amx_request_tiles() {
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

int64_t amx_packed_x_elements(int64_t M, int64_t K) { return (M + 15) / 16 * ((K + kChunk - 1) / kChunk) * kPackedTile; }

// out[((b * chunks + c) * 16 + p) * 32 + m * 2 + j] = x[(16 b + m) * K + 32 c + 2 p + j], zero past M and K: the B tile
// of rows 16 b.. of x and k 32 c.. at out + (b * chunks + c) * kPackedTile.
void amx_pack_x(const uint16_t* x, int64_t M, int64_t K, uint16_t* out) {
  const uint64_t chunks = (K + kChunk - 1) / kChunk, pairs = K / 2;
  std::memset(out, 0, amx_packed_x_elements(M, K) * 2);
  // A pair of k (j = 0, 1) stays together: in 32-bit words, word ((b * chunks + c) * 16 + p) * 16 + m % 16 holds the
  // pair q = 16 c + p of row m: a transpose of words, no division per element.
  auto pair_at = [](uint64_t q) { return ((q / 16) * 256 + (q % 16) * 16) * 2; };  // pair q's bf16 offset in a row's tiles
  for (int64_t m = 0; m < M; ++m) {
    const uint16_t* row = x + m * K;
    uint16_t* base = out + (m / 16) * chunks * kPackedTile + (m % 16) * 2;
    for (uint64_t q = 0; q < pairs; ++q) std::memcpy(base + pair_at(q), row + 2 * q, 4);
    if (K % 2) base[pair_at(pairs)] = row[K - 1];  // the last k alone, its pair's second half zero
  }
}

// y[m * ldy + n] = sum_k x[m][k] w[n][k] for the rows [m0, m0 + rows) of x (rows <= 32, m0 a multiple of 16; xb packed
// by amx_pack_x) and n in [n0, n1), (n1 - n0) a multiple of 32. Configures the tiles for this thread and releases them.
void bf16_dot_rows_amx(const uint16_t* xb, int64_t m0, int64_t rows, const uint16_t* w, int64_t K, int64_t n0,
                       int64_t n1, float* y, int64_t ldy) {
  const int64_t chunks = (K + kChunk - 1) / kChunk;
  const uint16_t* xb0 = xb + (m0 / 16) * chunks * kPackedTile;
  const uint16_t* xb1 = xb0 + chunks * kPackedTile;
  alignas(64) float c[4][16][16];
  configure_tiles();
  for (int64_t n = n0; n < n1; n += 32) {
    if (rows > 16) {
      group32<true>(xb0, xb1, w, K, n, c[0][0]);
    } else {
      group32<false>(xb0, xb1, w, K, n, c[0][0]);
    }
    // c[2 b + a][r][col]: row n + 16 a + r of w times row m0 + 16 b + col of x, i.e. y's block transposed.
    for (int64_t b = 0; b < 2 && 16 * b < rows; ++b) {
      const int64_t valid = std::min<int64_t>(16, rows - 16 * b);
      for (int a = 0; a < 2; ++a) store_transposed(c[2 * b + a][0], valid, y + (m0 + 16 * b) * ldy + n + 16 * a, ldy);
    }
  }
  _tile_release();
}

}  // namespace dtensor::detail
