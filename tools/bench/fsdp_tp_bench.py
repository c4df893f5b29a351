"""2-D parallelism benchmark: step time, tokens/s and peak memory per rank of llama_train under FSDP over dp
and TP over tp, for (dp, tp) in {(1,1), (2,1), (1,2), (2,2)} at world = dp * tp, beside PyTorch's fully_shard +
parallelize_module on the same config, weights and batches (tests/oracle/llama_oracle.py's worker) in the same run.
Prints a table; asserts nothing.

    .venv/bin/python tools/bench/fsdp_tp_bench.py build/bin [--steps N] [--dim N] [--layers N] [--seq-len N] [--batch N]

"no prefetch" is ours with --no-fsdp-prefetch (each block's all-gather issued when the block runs, not while
the one before it computes); rows with dp 1 have no all-gather to prefetch.

Step time is the median over the steps after the first two (warm-up). On a machine with fewer cores than ranks
the ranks share cores: compare the two columns of a row, not rows.
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


def config_args(a):
    return ["--dim", str(a.dim), "--layers", str(a.layers), "--heads", str(a.heads), "--kv-heads", str(a.kv_heads),
            "--ffn-dim", str(a.ffn_dim), "--seq-len", str(a.seq_len), "--batch", str(a.batch), "--steps", str(a.steps),
            "--warmup", "2", "--seed", "3"]


def run_ours(bin_dir, a, dp, tp, dump, extra=()):
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(dp * tp), "--master-port", "0", "llama_train",
           *config_args(a), "--dp", str(dp), "--tp", str(tp), "--fsdp", "--log-every", "1", *extra]
    write_dump(bin_dir, dump, config_args(a))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        sys.exit(f"llama_train failed at dp={dp} tp={tp}:\n{out.stdout}\n{out.stderr}")
    ms = [float(m) for m in re.findall(r"step +\d+ +loss \S+ +grad_norm \S+ +lr \S+ +([0-9.]+) ms/step", out.stdout)]
    rss = re.findall(r"peak_rss_mb \[([^\]]*)\]", out.stdout)[-1]
    losses = re.findall(r"step +\d+ +loss ([0-9.]+)", out.stdout)
    return statistics.median(ms[2:]), max(int(x) for x in rss.split(",")), float(losses[-1])


def run_pytorch(a, dp, tp, dump):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    cmd = [torchrun, "--standalone", "--nproc-per-node", str(dp * tp), ORACLE, "--worker", dump, str(dp)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if out.returncode != 0:
        return None, None, None
    ms = [float(m) for m in re.findall(r"\| ms ([0-9.]+)", out.stdout)]
    rss = re.findall(r"peak_rss_mb ([0-9]+)", out.stdout)  # rank 0's
    losses = re.findall(r"step \d+ loss ([0-9.]+)", out.stdout)
    return statistics.median(ms[2:]), int(rss[-1]), float(losses[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin_dir")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn-dim", type=int, default=384)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=8)
    a = p.parse_args()
    if a.steps < 3:
        sys.exit("error: --steps must be >= 3 (two warm-up steps)")
    tokens = a.batch * a.seq_len
    print(f"# Llama dim {a.dim}, {a.layers} layers, {a.heads} heads ({a.kv_heads} kv), ffn {a.ffn_dim}, seq {a.seq_len}, "
          f"global batch {a.batch} ({tokens} tokens/step), {a.steps} steps, FSDP over dp + TP over tp, fp32, CPU, "
          f"{os.cpu_count()} cores")
    print(f"{'dp':>3} {'tp':>3} | {'ours ms/step':>12} {'tokens/s':>9} {'peak MB/rank':>12} {'no prefetch':>11} | "
          f"{'PyTorch ms/step':>15} {'tokens/s':>9} {'peak MB (r0)':>12} | {'last loss ours / PyTorch':>24}")
    for dp, tp in [(1, 1), (2, 1), (1, 2), (2, 2)]:
        with tempfile.TemporaryDirectory() as tmp:
            dump = os.path.join(tmp, "llama")
            ms, rss, loss = run_ours(a.bin_dir, a, dp, tp, dump)
            eager = run_ours(a.bin_dir, a, dp, tp, dump + "_eager", ["--no-fsdp-prefetch"])[0] if dp > 1 else None
            pms, prss, ploss = run_pytorch(a, dp, tp, dump)
        theirs = (f"{pms:15.1f} {tokens / (pms / 1000):9.0f} {prss:12d}" if pms else f"{'failed':>15} {'':9} {'':12}")
        no_prefetch = f"{eager:11.1f}" if eager else f"{'-':>11}"
        print(f"{dp:3d} {tp:3d} | {ms:12.1f} {tokens / (ms / 1000):9.0f} {rss:12d} {no_prefetch} | {theirs} | "
              f"{loss:.6f} / {ploss if ploss is None else f'{ploss:.6f}'}", flush=True)
    print("summary bench=fsdp_tp configs=4")


if __name__ == "__main__":
    main()
