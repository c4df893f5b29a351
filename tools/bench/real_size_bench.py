"""Real sizes in real precision (issue 47): random checkpoints of Llama 3.2 1B / 3B and Llama 3.1 8B shapes, written
as transformers publishes them (bf16 shards + index: real_size_checkpoint.py, once per shape under --dir), generated
by ours (`tprun llama_generate --hf-dir`, TP 1 and 2, each --dtype) and by transformers (AutoModelForCausalLM in each
dtype, generate() greedy with its KV cache, torch threads = the machine's cores) in one invocation, on the same cores.

    .venv/bin/python tools/bench/real_size_bench.py build/bin [--shapes llama3.2-1b,llama3.2-3b] [--tp 1,2]
        [--dtypes bfloat16,float32] [--prompt-len 32] [--new-tokens 16] [--dir /tmp/real_sizes] [--no-hf]

Each runner starts with the checkpoint's files in the page cache (read once before it: a second load).
Columns, one row per (shape, runner, TP, dtype):
  load_s         ours: load_model (meta build, parallelize, each rank's shards mapped in place or read); HF:
                 from_pretrained. Pages mapped in place are faulted in by the first forward: prefill_ms holds them
  peak_rss_gb    per rank (ours: /usr/bin/time's maxrss of each rank; HF: its process)
  prefill_ms     the prompt's forward (ours: summary prefill_ms; HF: generate(max_new_tokens=1))
  ms_per_token   a decode step (ours: summary; HF: (generate(N) - generate(1)) / (N - 1))
  read_gbps      the weight bytes one decoded token reads (every parameter but the embedding table's rows, which a
                 lookup reads one of; a tied table is read once, as lm_head) / ms_per_token
  pct_bw         read_gbps / the machine's read bandwidth (a sum over 1 GiB on all cores, measured here first)
Prints progress, the table, and a `summary` line per row. Asserts nothing.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
PY = sys.executable


def read_bandwidth(threads):
    import torch
    torch.set_num_threads(threads)
    big = torch.ones(256 * 1024 * 1024, dtype=torch.float32)  # 1 GiB
    big.sum()
    t = time.perf_counter()
    for _ in range(5):
        big.sum()
    return big.numel() * 4 * 5 / (time.perf_counter() - t) / 1e9


def weight_bytes_per_token(ckpt, dtype_bytes):
    """Bytes of parameters a decode step reads: all but the embedding table (one row is read), which is read whole
    once more as lm_head when tied."""
    with open(os.path.join(ckpt, "config.json")) as f:
        c = json.load(f)
    h, i, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h
    params = layers * per_layer + h + v * h  # + final norm + lm_head (the tied table, or lm_head itself)
    return params * dtype_bytes


def ensure_checkpoint(shape, root):
    d = os.path.join(root, shape)
    if not os.path.exists(os.path.join(d, "config.json")):
        print(f"progress writing {shape} to {d}", flush=True)
        subprocess.run([PY, os.path.join(HERE, "real_size_checkpoint.py"), d, "--shape", shape], check=True)
    return d


def warm_page_cache(ckpt):
    """Reads the checkpoint's files once, so that every runner starts with them in the page cache (as a second load
    does): ours maps them in place and would otherwise pay the disk reads in its first prefill, the runner before it
    in its load."""
    for name in sorted(os.listdir(ckpt)):
        with open(os.path.join(ckpt, name), "rb", buffering=0) as f:
            while f.read(64 << 20):
                pass


def run_ours(bin_dir, ckpt, tp, dtype, prompt, new_tokens, threads):
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(tp), "--master-port", "0", "/usr/bin/time", "-f",
           "maxrss_kb=%M", os.path.join(bin_dir, "llama_generate"), "--hf-dir", ckpt, "--dtype", dtype,
           "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(new_tokens), "--no-stream"]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, threads // tp)))
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    wall = time.perf_counter() - t
    out = r.stdout + r.stderr
    m = re.search(r"summary .*prefill_ms=([\d.]+) ms_per_token=([\d.]+).*load_ms=([\d.]+)", out)
    if r.returncode != 0 or not m:
        return dict(error=out.strip().splitlines()[-3:] if out.strip() else [f"exit {r.returncode}"])
    rss = [int(x) / 1e6 for x in re.findall(r"maxrss_kb=(\d+)", out)]
    return dict(load_s=float(m.group(3)) / 1e3, prefill_ms=float(m.group(1)), ms_per_token=float(m.group(2)),
                rss=rss, wall_s=wall)


HF_SCRIPT = r"""
import json, resource, sys, time, torch
from transformers import AutoModelForCausalLM
ckpt, dtype, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
prompt = torch.tensor([json.loads(sys.argv[5])])
torch.set_num_threads(threads)
t = time.perf_counter()
model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, dtype)).eval()
load = time.perf_counter() - t
def gen(k):
    t = time.perf_counter()
    with torch.no_grad():
        model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=k,
                       min_new_tokens=k, pad_token_id=0)
    return time.perf_counter() - t
gen(2)  # warm-up
one = min(gen(1) for _ in range(2))
full = gen(n)
print(json.dumps(dict(load_s=load, prefill_ms=one * 1e3, ms_per_token=(full - one) / (n - 1) * 1e3,
                      rss=[resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6])))
"""


def run_hf(ckpt, dtype, prompt, new_tokens, threads):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", OMP_NUM_THREADS=str(threads))
    r = subprocess.run([PY, "-c", HF_SCRIPT, ckpt, dtype, str(new_tokens), str(threads), json.dumps(prompt)],
                       capture_output=True, text=True, env=env, timeout=3600)
    if r.returncode != 0:
        return dict(error=(r.stdout + r.stderr).strip().splitlines()[-3:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bin_dir")
    p.add_argument("--shapes", default="llama3.2-1b,llama3.2-3b")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--dir", default="/tmp/real_sizes")
    p.add_argument("--no-hf", action="store_true")
    a = p.parse_args()
    if a.new_tokens < 2 or a.prompt_len < 1:
        p.error("--new-tokens must be >= 2 and --prompt-len >= 1")
    tps = [int(x) for x in a.tp.split(",")]
    dtypes = a.dtypes.split(",")
    for d in dtypes:
        if d not in ("bfloat16", "float16", "float32"):
            p.error(f"--dtypes: '{d}' is not bfloat16, float16 or float32")
    threads = os.cpu_count() or 1
    bw = read_bandwidth(threads)
    print(f"progress read bandwidth {bw:.1f} GB/s on {threads} threads", flush=True)
    prompt = [1 + (7 * i) % 1000 for i in range(a.prompt_len)]
    rows = []
    for shape in a.shapes.split(","):
        ckpt = ensure_checkpoint(shape, a.dir)
        runs = [("ours", tp, d) for d in dtypes for tp in tps] + ([] if a.no_hf else [("transformers", 1, d) for d in dtypes])
        for runner, tp, dtype in runs:
            print(f"progress {shape} {runner} tp={tp} {dtype}", flush=True)
            warm_page_cache(ckpt)
            r = (run_ours(a.bin_dir, ckpt, tp, dtype, prompt, a.new_tokens, threads) if runner == "ours"
                 else run_hf(ckpt, dtype, prompt, a.new_tokens, threads))
            r.update(shape=shape, runner=runner, tp=tp, dtype=dtype)
            if "error" not in r:
                gbps = weight_bytes_per_token(ckpt, 2 if dtype != "float32" else 4) / (r["ms_per_token"] / 1e3) / 1e9
                r.update(read_gbps=gbps, pct_bw=100 * gbps / bw)
            rows.append(r)
            print("progress " + json.dumps(r), flush=True)
    print(f"\n| shape | runner | TP | dtype | load s | peak RSS per rank (GB) | prefill ms | ms/token | read GB/s | % of {bw:.0f} GB/s |")
    print("|---|---|---:|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['shape']} | {r['runner']} | {r['tp']} | {r['dtype']} | failed: {' / '.join(r['error'])[:120]} |")
            continue
        rss = ", ".join(f"{x:.2f}" for x in r["rss"])
        print(f"| {r['shape']} | {r['runner']} | {r['tp']} | {r['dtype']} | {r['load_s']:.1f} | {rss} | "
              f"{r['prefill_ms']:.0f} | {r['ms_per_token']:.1f} | {r['read_gbps']:.1f} | {r['pct_bw']:.0f} |")
    for r in rows:
        if "error" not in r:
            print(f"summary shape={r['shape']} runner={r['runner']} tp={r['tp']} dtype={r['dtype']} load_s={r['load_s']:.2f} "
                  f"peak_rss_gb={max(r['rss']):.2f} prefill_ms={r['prefill_ms']:.1f} ms_per_token={r['ms_per_token']:.2f} "
                  f"pct_bw={r['pct_bw']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
