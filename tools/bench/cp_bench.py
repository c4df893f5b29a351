"""Context parallelism on a long sequence: llama_train with one 16k-token sequence at cp 1 (one rank, 2 threads) and
cp 2 (two ranks, 1 thread each; allgather and alltoall rotations): step time, peak resident memory per rank, the
exposed communication per step, and the loss (which must be cp 1's). Prints a table and a `summary` line; asserts
nothing.

    .venv/bin/python tools/bench/cp_bench.py build/bin [--seq-len 16384] [--steps 3]

Memory: each rank's peak RSS (llama_train's peak_rss_mb), its activations (peak RSS minus the same run at a
64-token sequence: the process, the weights and the optimizer) beside it. Step time: the median of the steps after
the first. cp 2 runs two ranks on this machine's two cores, cp 1 one rank on both: the same cores either way.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys


def run(bin_dir, n, seq_len, steps, extra):
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(n), "--master-port", "0", "llama_train",
           "--seq-len", str(seq_len), "--batch", "1", "--steps", str(steps), "--log-every", "1",
           "--mixed-precision", "off", *extra]
    env = dict(os.environ, OMP_NUM_THREADS=str(2 // n))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if out.returncode != 0:
        sys.exit(f"llama_train failed: {' '.join(cmd)}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    steps_ms = [float(m) for m in re.findall(r"([0-9.]+) ms/step", out.stdout)]
    comm_ms = [float(m) for m in re.findall(r"ms/step \(comm ([0-9.]+)\)", out.stdout)]
    rss = [int(x) for x in re.findall(r"peak_rss_mb \[([0-9, ]+)\]", out.stdout)[-1].split(",")]
    loss = float(re.search(r"final_loss=([0-9.]+)", out.stdout).group(1))
    return {"ms": statistics.median(steps_ms[1:] or steps_ms), "comm": statistics.median(comm_ms[1:] or comm_ms),
            "rss": rss, "loss": loss}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--seq-len", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    rows = [("cp 1", 1, []), ("cp 2, allgather", 2, ["--cp", "2"]),
            ("cp 2, alltoall", 2, ["--cp", "2", "--cp-rotate-method", "alltoall"])]
    print(f"llama_train default model, one sequence of {a.seq_len} tokens, fp32, {a.steps} steps")
    print("| run | step (ms) | exposed comm (ms) | peak RSS per rank (MB) | activations per rank (MB) | loss |")
    print("|---|---:|---:|---:|---:|---:|")
    results = {}
    for label, n, extra in rows:
        base = run(a.bin_dir, n, 64, 2, extra)
        r = run(a.bin_dir, n, a.seq_len, a.steps, extra)
        results[label] = r
        act = [x - y for x, y in zip(r["rss"], base["rss"])]
        print(f"| {label} | {r['ms']:.0f} | {r['comm']:.0f} | {', '.join(map(str, r['rss']))} | "
              f"{', '.join(map(str, act))} | {r['loss']:.6f} |", flush=True)
    one, two = results["cp 1"], results["cp 2, allgather"]
    print(f"summary seq_len={a.seq_len} cp1_ms={one['ms']:.0f} cp2_ms={two['ms']:.0f} cp1_peak_mb={max(one['rss'])} "
          f"cp2_peak_mb={max(two['rss'])} loss_rel_diff={abs(one['loss'] - two['loss']) / one['loss']:.2e}")


if __name__ == "__main__":
    main()
