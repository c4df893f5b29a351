// The AMX tile configuration both AMX kernels load (bf16_dot_amx.cpp, bf16_packed_amx.cpp): palette 1, tiles 0-7
// each 16 rows of 64 bytes. Included only by files compiled with -mamx-tile, entered after the CPU was checked and
// Linux granted this process the tile state (fast_kernels.cpp). What each tile holds is said in each kernel.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace dtensor::detail::amx {

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// GCC's tile intrinsics are asm statements that name no memory: without this the compiler may drop the stores into a
// buffer that only a tile load reads, or read a buffer before the tile store into it.
inline void memory_barrier() { asm volatile("" ::: "memory"); }

inline void configure_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  memory_barrier();
  _tile_loadconfig(&cfg);
}

}  // namespace dtensor::detail::amx
