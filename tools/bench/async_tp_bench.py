"""Async TP benchmark: llama_train's step time at TP 2 (sequence parallel on) with and without --async-tp, on
llama_train's default config and a larger one, with the exposed communication time of each (the main thread's
time inside collectives: issuing them and blocked on them, dtensor/mesh/comm_clock.h) and the fraction of
collective time async TP hides:

    hidden = (sync comm ms - async comm ms) / sync comm ms

Beside them, PyTorch's synchronous TP (parallelize_module, torchtitan's plan, tests/oracle/llama_oracle.py's
worker) on the same weights and batches: PyTorch has no CPU async TP (its fused ops are CUDA symmetric-memory
kernels reached through torch.compile), so that column is the peer for the step, not for the overlap.
Prints a table; asserts nothing.

    .venv/bin/python tools/bench/async_tp_bench.py build/bin [--steps N] [--threads N]

--threads sets OMP_NUM_THREADS per rank (default 1). Step and comm times are medians over the steps after the
first two (warm-up). On CPU the overlap is bounded by the cores: the pieces of a fused op move on the rank's
communication thread (shared memory) or Gloo's threads, which need a core of their own while the matmuls run.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ORACLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "oracle", "llama_oracle.py")
sys.path.insert(0, os.path.dirname(ORACLE))
from llama_oracle import write_dump  # noqa: E402  (llama_dump: the weights and batches PyTorch's side trains on)

CONFIGS = {
    "default": [],  # llama_train's: dim 256, 4 layers, 8 heads (4 kv), ffn 768, seq 64, batch 4
    "larger": ["--dim", "512", "--ffn-dim", "1536", "--seq-len", "256", "--batch", "4"],
}


def run_ours(bin_dir, extra, steps, threads, dump=None, async_tp=False):
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", "2", "--master-port", "0", "llama_train", *extra,
           "--steps", str(steps), "--warmup", "2", "--seed", "3", "--log-every", "1"]
    if dump:
        write_dump(bin_dir, dump, [*extra, "--steps", str(steps), "--warmup", "2", "--seed", "3"])
    if async_tp:
        cmd.append("--async-tp")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if out.returncode != 0:
        sys.exit(f"llama_train failed ({' '.join(cmd)}):\n{out.stdout}\n{out.stderr}")
    rows = re.findall(r"step +\d+ +loss ([0-9.]+) .*? ([0-9.]+) ms/step \(comm ([0-9.]+)\)", out.stdout)
    ms = [float(r[1]) for r in rows][2:]
    comm = [float(r[2]) for r in rows][2:]
    return statistics.median(ms), statistics.median(comm), float(rows[-1][0])


def run_pytorch(dump, threads):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", "2", ORACLE, "--worker", dump, "1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=dict(os.environ, OMP_NUM_THREADS=str(threads)))
    if out.returncode != 0:
        return None, None
    ms = [float(m) for m in re.findall(r"\| ms ([0-9.]+)", out.stdout)]
    losses = re.findall(r"step \d+ loss ([0-9.]+)", out.stdout)
    return statistics.median(ms[2:]), float(losses[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin_dir")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-pytorch", action="store_true")
    a = p.parse_args()
    if a.steps < 4:
        sys.exit("error: --steps must be >= 4 (two warm-up steps)")
    print(f"# Llama TP 2 with sequence parallel, fp32, CPU, {os.cpu_count()} cores, OMP_NUM_THREADS={a.threads} per rank, "
          f"{a.steps} steps (median after 2), backend {os.environ.get('DTENSOR_BACKEND', 'shm')}")
    print(f"{'config':>8} | {'sync ms/step':>12} {'comm ms':>8} | {'async ms/step':>13} {'comm ms':>8} | "
          f"{'hidden':>7} {'speed-up':>8} | {'PyTorch sync TP ms':>18} | {'last loss sync / async / PyTorch':>34}")
    for name, extra in CONFIGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            dump = os.path.join(tmp, "llama")
            s_ms, s_comm, s_loss = run_ours(a.bin_dir, extra, a.steps, a.threads, dump=None if a.no_pytorch else dump)
            x_ms, x_comm, x_loss = run_ours(a.bin_dir, extra, a.steps, a.threads, async_tp=True)
            p_ms, p_loss = (None, None) if a.no_pytorch else run_pytorch(dump, a.threads)
        hidden = (s_comm - x_comm) / s_comm if s_comm > 0 else float("nan")
        theirs = f"{p_ms:18.1f}" if p_ms else f"{'-':>18}"
        ploss = f"{p_loss:.6f}" if p_loss else "-"
        print(f"{name:>8} | {s_ms:12.1f} {s_comm:8.1f} | {x_ms:13.1f} {x_comm:8.1f} | {hidden:7.1%} {s_ms / x_ms:7.2f}x | "
              f"{theirs} | {s_loss:.6f} / {x_loss:.6f} / {ploss}", flush=True)
    print(f"summary bench=async_tp configs={len(CONFIGS)}")


if __name__ == "__main__":
    main()
