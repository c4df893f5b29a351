// inference::keep_freed_memory (inference/heap.h), in a forked child so that this test process keeps glibc's defaults.
#include <gtest/gtest.h>
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "inference/heap.h"

namespace {

constexpr size_t kBig = size_t{64} << 20;  // twice glibc's largest mmap threshold (32 MB)

// Writes the block and lets it escape, so that the compiler keeps each malloc / free pair (GCC may drop a pair whose
// memory nothing reads).
void* touched(size_t bytes) {
  void* p = std::malloc(bytes);
  if (p != nullptr) std::memset(p, 1, bytes);
  asm volatile("" : : "r"(p) : "memory");
  return p;
}

// Runs `body` in a child; its return value is the child's exit code (0: every check held), -1 if it did not exit by
// itself within 30 s (then it is killed) or died of a signal.
template <typename Body>
int in_child(Body body) {
  const pid_t child = fork();
  if (child == 0) _exit(body());
  if (child < 0) return -1;
  int status = 0;
  for (int polls = 0; polls < 3000; ++polls) {  // 3000 x 10 ms
    if (waitpid(child, &status, WNOHANG) == child) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    usleep(10000);
  }
  kill(child, SIGKILL);
  waitpid(child, &status, 0);
  return -1;
}

}  // namespace

// By default a block larger than the heap's free space is a mapping of its own; after keep_freed_memory it comes from
// the heap (no new mapping), and once freed its bytes stay in the heap's free space for the next forward, instead of
// being unmapped.
TEST(InferenceHeap, KeepFreedMemoryServesLargeBlocksFromTheHeapAndKeepsThemFreed) {
  const int code = in_child([] {
    int bits = 0;
    // Larger than all the heap's free space, so that no free chunk can serve it: glibc's choice is top or a mapping.
    auto beyond_free = [] { return mallinfo2().fordblks + kBig; };
    const size_t maps = mallinfo2().hblks;
    const size_t first = beyond_free();
    void* before = touched(first);
    if (mallinfo2().hblks != maps + 1) bits |= 1;  // glibc's default: mapped
    std::free(before);
    if (!inference::keep_freed_memory()) bits |= 2;
    const size_t size = beyond_free();
    void* after = touched(size);
    if (mallinfo2().hblks != maps) bits |= 4;  // from the heap
    std::free(after);
    if (mallinfo2().fordblks < size) bits |= 8;  // kept, free, in the heap
    void* again = touched(size);
    if (again != after) bits |= 16;  // the same pages again
    std::free(again);
    return bits;
  });
  EXPECT_EQ(code, 0) << "-1: the child hung or died; else failed checks (bits): 1 default not mapped, "
                        "2 policy not applied, 4 still mapped, "
                        "8 freed bytes not kept, 16 not reused";
}

// glibc's own settings in the environment rule: the policy is not applied over them.
TEST(InferenceHeap, KeepFreedMemoryLeavesTheEnvironmentsSettingsToRule) {
  const int code = in_child([] {
    setenv("MALLOC_MMAP_MAX_", "65536", 1);
    return inference::keep_freed_memory() ? 1 : 0;
  });
  EXPECT_EQ(code, 0);
}
