"""PyTorch's twin of llama_step_bench: one Llama training step (forward, backward, clipping, AdamW) under
torchtitan's TP + SP plan with loss parallel through PyTorch's parallelize_module (Gloo: the only CPU
backend it has), with two cores spent as TP=1 on 2 threads or TP=2 on 1 thread per rank; prints the median
step time of each and the ratio. The model and plan are tests/oracle/llama_torch.py's (the parity oracle's).

    .venv/bin/python tools/bench/llama_step_bench.py [--dim 512] [--layers 4] [--seq-len 256] [--batch 8]
                                                     [--steps 12] [--repeats 3]
"""
import argparse
import contextlib
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def worker(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel
    sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "oracle"))
    from llama_torch import apply_torchtitan_tp, build_llama
    from peer_exit import end_process_group

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    # sdpa_flash at TP 1: plain tensors may take SDPA's flash kernel (its DTensor has no rule for it).
    cfg = dict(vocab_size=256, hidden_size=args.dim, num_hidden_layers=args.layers, num_attention_heads=args.heads,
               num_key_value_heads=args.kv_heads, intermediate_size=3 * args.dim, rope_theta=500000.0,
               rms_norm_eps=1e-5, sdpa_flash=world == 1)
    torch.manual_seed(0)
    model = build_llama(cfg)
    if args.float8:  # torchao's Float8Linear on every Linear but lm_head (its float8 TP styles need a float8
        # all-gather, which Gloo lacks: TP keeps the plain styles)
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                   module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    if world > 1:
        apply_torchtitan_tp(model, init_device_mesh("cpu", (world,), mesh_dim_names=("tp",)))
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=False)
    gen = torch.Generator().manual_seed(1)
    times = []
    for _ in range(args.steps):
        window = torch.randint(0, 256, (args.batch, args.seq_len + 1), generator=gen)
        inputs, labels = window[:, :-1].contiguous(), window[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad()
        # bf16: torchtitan's TP-without-FSDP recipe, autocast around the forward (fp32 masters, bf16 matmuls);
        # the loss in fp32 as llama_train computes it.
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if args.mixed_precision == "bf16" else contextlib.nullcontext()
        with loss_parallel() if world > 1 else contextlib.nullcontext():
            with amp:
                logits = model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=False)
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    if dist.get_rank() == 0:
        print(f"median_step_ms={statistics.median(times[3:]):.3f}", flush=True)  # as llama_train: 3 warm-up steps
    end_process_group(0)


def main():
    p = argparse.ArgumentParser()
    for name, default in [("dim", 512), ("layers", 4), ("seq-len", 256), ("batch", 8), ("steps", 12), ("repeats", 3),
                          ("threads", 0), ("heads", 8), ("kv-heads", 4)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--mixed-precision", choices=["bf16", "off"], default="bf16",
                   help="bf16: autocast (fp32 masters, bf16 compute), as llama_train's default; off: fp32")
    p.add_argument("--float8", action="store_true", help="torchao's float8 tensorwise Linear layers (not lm_head)")
    p.add_argument("--worker", action="store_true")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.steps < 5:
        p.error("--steps must be at least 5 (3 warm-up steps are skipped)")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    rows = []
    for label, nproc, threads in [("TP=1, 2 threads", 1, 2), ("TP=2, 1 thread/rank, gloo", 2, 1)]:
        runs = []
        for r in range(args.repeats):
            cmd = [torchrun, "--standalone", "--nproc-per-node", str(nproc), os.path.abspath(__file__), "--worker",
                   "--threads", str(threads)] + [f"--{k}={getattr(args, k.replace('-', '_'))}"
                                                 for k in ("dim", "layers", "seq-len", "batch", "steps", "mixed-precision")]
            out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS=str(threads)), capture_output=True,
                                 text=True, timeout=1200)
            m = re.search(r"median_step_ms=([0-9.]+)", out.stdout)
            if out.returncode != 0 or not m:
                sys.exit(f"error: PyTorch run ({label}) failed:\n{out.stdout}\n{out.stderr[-3000:]}")
            runs.append(float(m.group(1)))
            print(f"progress {label} run {r + 1}/{args.repeats}: median step {runs[-1]:.1f} ms", flush=True)
        rows.append((label, statistics.median(runs)))
    print(f"\n# PyTorch Llama step (dim {args.dim}, {args.layers} layers, seq {args.seq_len}, batch {args.batch}, "
          "SP + loss parallel), two cores")
    print(f"{'configuration':28s} {'step (ms)':>14s} {'vs TP=1':>14s}")
    for label, ms in rows:
        print(f"{label:28s} {ms:14.1f} {ms / rows[0][1]:13.2f}x")
    print(f"summary tp1_ms={rows[0][1]:.1f} tp2_gloo_ms={rows[1][1]:.1f} ratio_gloo={rows[1][1] / rows[0][1]:.3f}")


if __name__ == "__main__":
    main()
