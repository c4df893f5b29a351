// How a generating or serving process's heap keeps the memory it frees. vLLM's CPU engine preloads tcmalloc for the
// same reason; we ask glibc's malloc instead.
//
// glibc serves every allocation at or above its mmap threshold (at most 32 MB) by a fresh mmap and unmaps it at free,
// so each forward's large temporaries (a prefill of 2048 tokens: 32 MB per [2048, 8192] bf16 activation) take new
// pages that the kernel clears: 6% of a batch-64 prefill's samples on Zen 5, in clear_page_erms
// (docs/benchmarks.md). keep_freed_memory() turns that off (M_MMAP_MAX 0: every block from the heap; M_TRIM_THRESHOLD
// unbounded: its free top is kept), so a later forward reuses the pages. The cost: the peak heap stays the process's
// (measured: max RSS 5.44 against 5.35 GB for the 1B shape at batch 64).
#pragma once

namespace inference {

// Once, before the model loads. A MALLOC_MMAP_MAX_ or MALLOC_TRIM_THRESHOLD_ in the environment (glibc's own
// settings) is left to rule. Returns whether the policy was applied.
bool keep_freed_memory();

}  // namespace inference
