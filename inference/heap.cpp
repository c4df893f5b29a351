#include "inference/heap.h"

#include <malloc.h>

#include <cstdlib>

namespace inference {

bool keep_freed_memory() {
  if (std::getenv("MALLOC_MMAP_MAX_") || std::getenv("MALLOC_TRIM_THRESHOLD_")) return false;
  const bool no_maps = mallopt(M_MMAP_MAX, 0) == 1;
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, -1) == 1;  // -1: SIZE_MAX in glibc's size_t, never trim
  return no_maps && no_trim;
}

}  // namespace inference
