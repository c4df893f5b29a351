"""What the Python benchmark twins share, timed as tools/bench/bench_util.h times the C++ ones."""
import os
import statistics
import sys
import time

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "oracle"))
from peer_exit import end_process_group  # noqa: E402,F401  (how the torchrun benchmarks end: see peer_exit.py)


def batched_median_us(iters, fn):
    """For calls too short to time one by one: the median over 15 batches of the mean time per call (us)."""
    for _ in range(iters // 10 + 10):
        fn()
    batches = []
    for _ in range(15):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        batches.append((time.perf_counter() - t0) * 1e6 / iters)
    return statistics.median(batches)


def synchronized_median_us(iters, fn):
    """For collectives: every call starts together after a barrier; the median single call (us)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)
