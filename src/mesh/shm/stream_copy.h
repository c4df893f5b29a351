// Copying out of the shared buffers into the caller's tensor, with or without the cache.
//
// A large collective's output (tens of MiB) is written once and not read back by the collective; ordinary
// stores first read every destination line from memory (read-for-ownership), so a copy moves 3 bytes of
// DRAM traffic per byte, and the output evicts the shared buffers from the cache. Non-temporal (streaming)
// stores write whole lines straight to memory: 2 bytes per byte, and the staging buffers stay cached.
// Measured on this 2-core host (64 MiB, loaded machine): memcpy 1.5-1.7 GB/s, streaming 1.9-2.8 GB/s per
// core; two cores at once 1.8-2.1 vs 3.7 GB/s.
//
// Small outputs are better left in the cache (the next op reads them), so callers stream only from
// streaming_bytes() up. `copy_bytes_reference` (plain memcpy) is the naive path the tests compare with.
#pragma once

#include <cstdint>

namespace dtensor::detail::shm {

// Outputs at least this large (bytes) are written with streaming stores: DTENSOR_SHM_STREAMING_BYTES, else
// 8 MiB (a quarter of this host's L3); 0 streams everything, a huge value nothing (for A/B measurements).
int64_t streaming_bytes();

// dst <- src, n bytes; `streaming`: non-temporal stores (x86-64; elsewhere memcpy), fenced before return
// so a barrier after it publishes the data.
void copy_bytes(void* dst, const void* src, int64_t n, bool streaming);
void copy_bytes_reference(void* dst, const void* src, int64_t n);

}  // namespace dtensor::detail::shm
