"""LoRA fine-tuning at real size, side by side in one invocation: llama_train --lora-rank at TP 1 and TP 2 against PEFT
on transformers, the same random checkpoint of a real shape (bf16, as published: tools/bench/real_size_checkpoint.py),
the same adapters (r 16, alpha 32, the seven projections), batch 1 of --seq-len tokens, a few AdamW steps.

    .venv/bin/python tools/bench/lora_bench.py [--shapes llama3.2-1b,llama3.2-3b,llama3.1-8b] [--root /tmp/real_sizes]
        [--seq-len 128] [--steps 4] [--activation-checkpoint full] [--dtype bfloat16|float32] [--skip-peft]

Ours: the base mapped in bf16 from the files (--dtype float32: widened to fp32 on load, --mixed-precision off), the
adapters fp32 (the branch in fp32), activation checkpointing per block. On a CPU without AVX-512 (AMD Zen 3) PyTorch's
bf16 matmuls fall back to its reference GEMM (at::native::cpublas::gemm, one thread): there the fp32 base is the fast
one where it fits. PEFT: AutoModelForCausalLM in the same dtype with get_peft_model (adapters fp32: autocast_adapter_dtype), gradient
checkpointing on (transformers' own), AdamW on the adapters, torch threads = the cores. Printed per run: the median step
time after the first, the peak RSS per process (/usr/bin/time), trainable parameters. Ends with a `summary` line.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PY = sys.executable
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
sys.path.insert(0, HERE)
from real_size_bench import ensure_checkpoint  # noqa: E402  (writes the random checkpoint of a shape once)

PEFT_SCRIPT = r"""
import resource, sys, time, torch
import torch.nn.functional as F
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
ckpt, seq, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=getattr(torch, sys.argv[6]))
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
model.enable_input_require_grads()
model.train()  # transformers checkpoints only in training mode
model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=sys.argv[5].split(","), task_type="CAUSAL_LM"))
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4)
g = torch.Generator().manual_seed(0)
times = []
for step in range(steps):
    ids = torch.randint(0, model.config.vocab_size, (1, seq + 1), generator=g)
    t = time.perf_counter()
    logits = model(input_ids=ids[:, :-1]).logits
    loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step(); opt.zero_grad()
    times.append((time.perf_counter() - t) * 1000)
    print(f"peft step {step + 1} loss {loss.item():.4f} {times[-1]:.0f} ms", flush=True)
print(f"peft_result ms={sorted(times[1:])[len(times[1:]) // 2]:.1f} trainable={sum(p.numel() for p in params)} "
      f"rss_kb={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", flush=True)
"""


def run_ours(bin_dir, ckpt, tp, args):
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(tp), "--master-port", "0", "/usr/bin/time", "-f",
           "maxrss_kb=%M", os.path.join(bin_dir, "llama_train"), "--hf-dir", ckpt, "--lora-rank", "16", "--lora-alpha",
           "32", "--lora-targets", TARGETS, "--seq-len", str(args.seq_len), "--batch", "1", "--steps", str(args.steps),
           "--warmup", "1", "--lr", "1e-4", "--log-every", "1", "--activation-checkpoint", args.activation_checkpoint]
    if args.dtype == "float32":
        cmd += ["--mixed-precision", "off", "--dtype", "float32"]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, os.cpu_count() // tp)))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=7200)
    out = r.stdout + r.stderr
    steps = [float(x) for x in re.findall(r"^(?:\[rank0\]: )?step +\d+ .* ([\d.]+) ms/step", r.stdout, re.M)]
    m = re.search(r"trainable params: (\d+)", r.stdout)
    if r.returncode != 0 or not steps:
        return dict(error=out.strip().splitlines()[-3:] if out.strip() else [f"exit {r.returncode}"])
    return dict(ms=statistics.median(steps[1:] or steps), rss=[int(x) / 1e6 for x in re.findall(r"maxrss_kb=(\d+)", out)],
                trainable=int(m.group(1)) if m else 0)


def run_peft(ckpt, args):
    cmd = [PY, "-c", PEFT_SCRIPT, ckpt, str(args.seq_len), str(args.steps), str(os.cpu_count()), TARGETS, args.dtype]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=7200)
    m = re.search(r"peft_result ms=([\d.]+) trainable=(\d+) rss_kb=(\d+)", r.stdout)
    if r.returncode != 0 or not m:
        return dict(error=(r.stdout + r.stderr).strip().splitlines()[-3:])
    return dict(ms=float(m.group(1)), trainable=int(m.group(2)), rss=[int(m.group(3)) / 1e6])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="llama3.2-1b")
    ap.add_argument("--root", default="/tmp/real_sizes")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--activation-checkpoint", default="full")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--skip-peft", action="store_true")
    args = ap.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = re.search(r"Model name:\s*(.*)", cpu)
    print(f"machine: {model.group(1).strip() if model else '?'}, {os.cpu_count()} cores; seq {args.seq_len}, batch 1, "
          f"r 16, alpha 32, targets {TARGETS}, activation checkpointing {args.activation_checkpoint}, base {args.dtype}", flush=True)
    rows = []
    started = time.time()
    for shape in args.shapes.split(","):
        ckpt = ensure_checkpoint(shape, args.root)
        for tp in [int(t) for t in args.tp.split(",")]:
            print(f"progress {shape} ours TP {tp}", flush=True)
            rows.append((shape, f"ours TP {tp}", run_ours(args.bin, ckpt, tp, args)))
        if not args.skip_peft:
            print(f"progress {shape} PEFT", flush=True)
            rows.append((shape, "PEFT + transformers", run_peft(ckpt, args)))
    print("| shape | runner | ms/step (median) | peak RSS per process (GB) | trainable params |")
    print("|---|---|---:|---:|---:|")
    ok = 0
    for shape, runner, r in rows:
        if "error" in r:
            print(f"| {shape} | {runner} | error: {' / '.join(r['error'])} | | |")
            continue
        ok += 1
        print(f"| {shape} | {runner} | {r['ms']:.0f} | {', '.join(f'{x:.2f}' for x in r['rss'])} | {r['trainable']:,} |")
    print(f"summary runs={len(rows)} ok={ok} seconds={time.time() - started:.0f}")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
