#include "mesh/shm/stream_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace dtensor::detail::shm {

int64_t streaming_bytes() {
  static const int64_t bytes = [] {
    const char* v = std::getenv("DTENSOR_SHM_STREAMING_BYTES");
    return v && *v ? std::max<int64_t>(0, std::atoll(v)) : int64_t(8) << 20;
  }();
  return bytes;
}

void copy_bytes_reference(void* dst, const void* src, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n));
}

void copy_bytes(void* dst, const void* src, int64_t n, bool streaming) {
#if defined(__x86_64__)
  if (streaming && n >= 256) {
    auto* d = static_cast<char*>(dst);
    auto* s = static_cast<const char*>(src);
    // Head up to 16-byte alignment of the destination, then 64 bytes (one line) per step, then the tail.
    const int64_t head = static_cast<int64_t>((16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
    std::memcpy(d, s, static_cast<size_t>(head));
    int64_t i = head;
    for (; i + 64 <= n; i += 64) {
      __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
      __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
      __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
      __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
    }
    std::memcpy(d + i, s + i, static_cast<size_t>(n - i));
    _mm_sfence();  // streaming stores are weakly ordered: make them visible before any later release store
    return;
  }
#endif
  (void)streaming;
  copy_bytes_reference(dst, src, n);
}

}  // namespace dtensor::detail::shm
