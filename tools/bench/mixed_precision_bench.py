"""Mixed-precision training, ours beside PyTorch's, in one invocation on the same cores: one Llama step (forward,
backward, clipping, AdamW; torchtitan's TP + SP plan with loss parallel at TP 2) of

  ours     tprun llama_train --mixed-precision bf16|off      (fp32 masters, bf16 compute, fp32 reductions)
  PyTorch  torch.autocast("cpu", bfloat16) around the forward  (the same recipe: fp32 parameters, bf16 matmuls)
and, as "bf16+float8", both with float8 tensorwise Linear layers (ours --float8 with its float8 styles at TP 2;
torchao's convert_to_float8_training under PyTorch's plain styles: Gloo has no float8 all-gather)

at TP 1 (one process, 2 threads) and TP 2 (two processes, 1 thread each), with the bf16 and fp32 matmul peaks of
this machine measured in the same run (2048^3 mm, 2 threads), the step's model FLOP/s (6 x matmul parameters x
tokens + 12 x layers x batch x seq^2 x dim for attention, forward and backward) and their share of the peak.

    .venv/bin/python tools/bench/mixed_precision_bench.py build/bin [--dim 512] [--layers 4] [--heads 4] [--kv-heads 2]
        [--seq-len 256] [--batch 8] [--steps 12] [--repeats 3] [--no-pytorch] [--precisions bf16,off,bf16+float8]
        [--float8-matmul auto|scaled_mm|emulated|emulated_bf16]

The medians skip each run's first 3 steps. Prints progress, a table, then a `summary` line.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
comm_bytes = {}  # (precision, TP) -> our communication bytes per step


def matmul_peak_gflops(dtype_name, threads=2, n=2048):
    import torch
    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    best = float("inf")
    for _ in range(6):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def model_flops(a):
    hd = a.dim // a.heads
    per_layer = a.dim * (a.heads * hd) * 2 + a.dim * (a.kv_heads * hd) * 2 + 3 * a.dim * 3 * a.dim
    matmul_params = a.layers * per_layer + a.dim * 256  # + lm_head (vocab 256)
    tokens = a.batch * a.seq_len
    return 6 * matmul_params * tokens + 12 * a.layers * a.batch * a.seq_len ** 2 * a.dim


def ours(bin_dir, a, mp, nproc):
    """(median step ms, communication bytes per step) of llama_train; mp "bf16+float8" adds --float8."""
    threads = 2 // nproc
    float8 = mp.endswith("+float8")
    mp = mp.split("+")[0]
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(nproc), "--master-port", "0", "llama_train",
           "--dim", str(a.dim), "--layers", str(a.layers), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
           "--ffn-dim", str(3 * a.dim), "--seq-len", str(a.seq_len), "--batch", str(a.batch), "--steps", str(a.steps),
           "--log-every", str(a.steps), "--mixed-precision", mp] + (
               ["--float8", "--float8-matmul", a.float8_matmul] if float8 else [])
    out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS=str(threads), DTENSOR_BACKEND="shm"),
                         capture_output=True, text=True, timeout=1200)
    m = re.search(r"median_step_ms=([0-9.]+)", out.stdout)
    c = re.search(r"comm_bytes_per_step=([0-9]+)", out.stdout)
    if out.returncode != 0 or not m or not c:
        sys.exit(f"error: llama_train failed:\n{out.stdout}\n{out.stderr[-3000:]}")
    comm_bytes[(mp + ("+float8" if float8 else ""), nproc)] = int(c.group(1))
    chosen = re.search(r"float8_matmul=(.*?) batch=", out.stdout)
    if chosen:
        print(f"progress ours tp={nproc}: float8_matmul={chosen.group(1)}", flush=True)
    return float(m.group(1))


def theirs(a, mp, nproc):
    threads = 2 // nproc
    float8 = mp.endswith("+float8")
    mp = mp.split("+")[0]
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", str(nproc), os.path.join(HERE, "llama_step_bench.py"),
           "--worker", "--threads", str(threads), f"--dim={a.dim}", f"--layers={a.layers}", f"--heads={a.heads}",
           f"--kv-heads={a.kv_heads}", f"--seq-len={a.seq_len}", f"--batch={a.batch}", f"--steps={a.steps}",
           f"--mixed-precision={mp}"] + (["--float8"] if float8 else [])
    out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS=str(threads)), capture_output=True, text=True,
                         timeout=1200)
    m = re.search(r"median_step_ms=([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"error: PyTorch run failed:\n{out.stdout}\n{out.stderr[-3000:]}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin_dir")
    for name, default in [("dim", 512), ("layers", 4), ("heads", 4), ("kv-heads", 2), ("seq-len", 256), ("batch", 8),
                          ("steps", 12), ("repeats", 3)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--no-pytorch", action="store_true")
    p.add_argument("--precisions", default="bf16,off,bf16+float8", help="comma-separated: bf16, off, bf16+float8")
    p.add_argument("--float8-matmul", default="auto", help="ours: llama_train --float8-matmul")
    a = p.parse_args()
    if a.steps < 5:
        p.error("--steps must be at least 5 (3 warm-up steps are skipped)")
    flops = model_flops(a)
    rows = []  # (mp, who, tp, ms)
    plan = [(mp, who, tp) for mp in a.precisions.split(",") for tp in (1, 2) for who in ("ours", "PyTorch")
            if not (a.no_pytorch and who == "PyTorch")]
    peaks = {"bfloat16": [], "float32": []}
    for r in range(a.repeats):
        for dt in peaks:  # interleaved with the runs: the VM's speed drifts
            peaks[dt].append(matmul_peak_gflops(dt))
        for mp, who, tp in plan:
            ms = ours(a.bin_dir, a, mp, tp) if who == "ours" else theirs(a, mp, tp)
            rows.append((mp, who, tp, ms))
            print(f"progress run {r + 1}/{a.repeats} {who} mixed_precision={mp} tp={tp}: median step {ms:.1f} ms",
                  flush=True)
    peak = {dt: statistics.median(v) for dt, v in peaks.items()}
    med = {(mp, who, tp): statistics.median([ms for m2, w2, t2, ms in rows if (m2, w2, t2) == (mp, who, tp)])
           for mp, who, tp in plan}
    print(f"\n# Llama step: dim {a.dim}, {a.layers} layers, {a.heads} heads ({a.kv_heads} kv), ffn {3 * a.dim}, seq "
          f"{a.seq_len}, batch {a.batch}; two cores; {flops / 1e9:.1f} GFLOP per step")
    print(f"# matmul peak (2048^3, 2 threads): bf16 {peak['bfloat16']:.0f} GFLOP/s, fp32 {peak['float32']:.0f} GFLOP/s")
    print(f"{'precision':12s} {'who':8s} {'TP':>3s} {'step ms':>9s} {'vs PyTorch':>11s} {'TP2/TP1':>8s} "
          f"{'GFLOP/s':>8s} {'% peak':>7s} {'comm MB':>8s}")
    for mp, who, tp in plan:
        ms = med[(mp, who, tp)]
        vs = ms / med[(mp, "PyTorch", tp)] if (mp, "PyTorch", tp) in med else float("nan")
        gf = flops / (ms / 1e3) / 1e9
        pk = peak["float32" if mp == "off" else "bfloat16"]
        mb = f"{comm_bytes[(mp, tp)] / 1e6:8.1f}" if who == "ours" and tp > 1 else f"{'-':>8s}"
        print(f"{mp:12s} {who:8s} {tp:3d} {ms:9.1f} {vs:10.2f}x {ms / med[(mp, who, 1)]:8.2f} {gf:8.0f} "
              f"{100 * gf / pk:6.0f}% {mb}")
    s = med[("bf16", "ours", 1)]
    fields = [f"ours_bf16_tp1_ms={s:.1f}", f"ours_bf16_tp2_ms={med[('bf16', 'ours', 2)]:.1f}",
              f"ours_tp2_over_tp1={med[('bf16', 'ours', 2)] / s:.3f}",
              f"ours_bf16_pct_of_peak={100 * flops / (s / 1e3) / 1e9 / peak['bfloat16']:.1f}",
              f"bf16_peak_gflops={peak['bfloat16']:.0f}"]
    fields += [f"ours_float8_tp1_ms={med[('bf16+float8', 'ours', 1)]:.1f}",
               f"ours_float8_comm_bytes_tp2={comm_bytes[('bf16+float8', 2)]}", f"ours_bf16_comm_bytes_tp2={comm_bytes[('bf16', 2)]}"]
    if not a.no_pytorch:
        fields += [f"pytorch_autocast_tp1_ms={med[('bf16', 'PyTorch', 1)]:.1f}",
                   f"ours_over_pytorch_tp1={s / med[('bf16', 'PyTorch', 1)]:.3f}"]
    print("summary " + " ".join(fields))


if __name__ == "__main__":
    main()
