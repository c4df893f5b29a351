"""Mixture of experts: a training step and a decode step on 1 rank, at TP 2 (transformers 5's expert TP: every
rank a slice of every expert) and at EP 2 (ExpertParallel: whole experts per rank, tokens sent by all_to_all),
with the all_to_all bytes per token beside the theoretical minimum. Prints the tables; asserts nothing.

    .venv/bin/python tools/bench/moe_bench.py build/bin [--steps 30] [--new-tokens 32] [--batch 8]

The model: a random transformers MixtralForCausalLM (vocab 512, hidden 256, 4 layers, 8 heads, 4 key/value
heads, 8 experts of intermediate 512, top-2; HF's own init) saved with save_pretrained into a temporary
directory. Training: `tprun llama_train --hf-dir` (the default corpus, batch 8 x 64 tokens, global: at EP 2
each rank takes 4 sequences, EP borrowing the data-parallel ranks; --comm-detail gives rank 0's collectives).
Decode: `tprun llama_generate --hf-dir` (a 16-token prompt, greedy; rank 0's collectives over prefill and
decode), and transformers' generate() on the same model object on 1 thread beside it. Generation holds the
batch on every rank, so EP decoding dispatches nothing: each rank computes its experts' (token, slot) pairs and
one all-reduce per block sums them.

Training's all-to-all bytes per token, per sparse layer (H = hidden, b = 4 bytes, k = 2, ep = 2, E = 8):
  ours          what rank 0's all_to_alls carried / the tokens rank 0 routed: one H-row per (token, slot)
                each way (dispatch and combine; the local share included, as the process group counts it),
                plus the E counts; backward repeats dispatch and combine.
  off-rank      the part that leaves the rank: k * (ep - 1) / ep rows each way under balanced routing.
  minimum       each token sent once to each other rank that holds one of its experts and its combined
                output sent back once: 2 * (ep - 1) * P(that rank is hit) rows, P = 1 - C(E - E/ep, k) / C(E, k)
                under uniform routing (DeepSeek-V3's node-limited dispatch sends one copy per rank).
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile
import time

SIZES = dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, num_local_experts=8, num_experts_per_tok=2)
LAYOUTS = [("1 rank", 1, []), ("TP 2", 2, ["--tp", "2"]), ("EP 2", 2, ["--ep", "2"])]


def make_model(out_dir):
    import torch
    import transformers
    torch.manual_seed(0)
    config = transformers.MixtralConfig(**SIZES, max_position_embeddings=512, sliding_window=None)
    model = transformers.MixtralForCausalLM(config).eval()
    model.save_pretrained(out_dir)
    return model


def run(cmd):
    out = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=900)
    m = re.search(r"summary (.*)$", out.stdout, re.M)
    if out.returncode != 0 or not m:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}, out.stdout


def a2a_bytes_of_comm_line(stdout):
    """rank 0's all_to_all bytes (forward + backward) of the last logged step's `comm` line."""
    lines = re.findall(r"comm step \d+ fwd_bwd(.*?) \|", stdout)
    m = re.search(r"all_to_all=\d+:(\d+)", lines[-1]) if lines else None
    return int(m.group(1)) if m else 0


def minimum_rows_per_token(ep, experts, k):
    """Rows per token per layer, dispatch + combine, of the one-copy-per-rank scheme under uniform routing."""
    per_rank = experts // ep
    p_hit = 1 - math.comb(experts - per_rank, k) / math.comb(experts, k)
    return 2 * (ep - 1) * p_hit


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    args = ap.parse_args()
    tprun = os.path.join(args.bin_dir, "tprun")
    H, k, E, layers, b = SIZES["hidden_size"], SIZES["num_experts_per_tok"], SIZES["num_local_experts"], SIZES["num_hidden_layers"], 4
    row = H * b
    with tempfile.TemporaryDirectory() as d:
        model = make_model(d)
        print(f"Mixtral: {SIZES}")
        print(f"\nTraining step (global batch {args.batch} x {args.seq_len} tokens, {args.steps} steps, median):")
        print(f"| layout | ms/step | exposed comm ms | comm MB/step | tokens/s | final loss | a2a bytes/token/layer (fwd+bwd) | off-rank (balanced) | minimum |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, n, flags in LAYOUTS:
            summary, stdout = run([tprun, "--nproc-per-node", str(n), "--master-port", "0", "llama_train", "--hf-dir", d,
                                   "--steps", str(args.steps), "--batch", str(args.batch), "--seq-len", str(args.seq_len),
                                   "--log-every", str(args.steps), "--comm-detail", *flags])
            ep = 2 if "--ep" in flags else 1
            tokens_rank = args.batch * args.seq_len // ep
            a2a = a2a_bytes_of_comm_line(stdout) / tokens_rank / layers if ep > 1 else 0
            off = 2 * 2 * k * (ep - 1) / ep * row  # dispatch + combine, forward + backward
            minimum = 2 * minimum_rows_per_token(ep, E, k) * row if ep > 1 else 0
            print(f"| {name} | {summary['median_step_ms']:.1f} | {summary['median_comm_ms']:.1f} | "
                  f"{summary['comm_bytes_per_step'] / 1e6:.2f} | {summary['tokens_per_s']:.0f} | {summary['final_loss']:.6f} "
                  f"| {a2a:.0f} | {off:.0f} | {minimum:.0f} |")
        prompt = [(7 * i + 3) % SIZES["vocab_size"] for i in range(16)]
        print(f"\nDecode step (batch 1, 16-token prompt, {args.new_tokens} new tokens, greedy):")
        print("| layout | ms/token | tokens/s | collective bytes/token/layer | of which a2a |")
        print("|---|---:|---:|---:|---:|")
        for name, n, flags in LAYOUTS:
            summary, _ = run([tprun, "--nproc-per-node", str(n), "--master-port", "0", "llama_generate", "--hf-dir", d,
                              "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", str(args.new_tokens),
                              "--no-stream", *flags])
            routed = summary["prompt_tokens"] + summary["new_tokens"] - 1  # tokens through the model
            print(f"| {name} | {summary['ms_per_token']:.2f} | {summary['tokens_per_s']:.1f} | "
                  f"{summary['comm_bytes'] / routed / layers:.0f} | {summary['all_to_all_bytes'] / routed / layers:.0f} |")
        import torch
        torch.set_num_threads(1)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            def timed(n):
                t0 = time.perf_counter()
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                               min_new_tokens=n)
                return (time.perf_counter() - t0) * 1000
            timed(2)
            prefill = min(timed(1) for _ in range(3))
            total = min(timed(args.new_tokens) for _ in range(2))
        ms = (total - prefill) / (args.new_tokens - 1)
        print(f"| transformers generate, 1 thread | {ms:.2f} | {1000 / ms:.1f} | | |")
        print("\n(bytes as rank 0's process group counts them (its inputs), over the tokens rank 0 routes; decode's "
              "include the prefill. Decoding holds the batch on every rank: EP computes each rank's experts' pairs and "
              "all-reduces the block's output, with no all_to_all; TP all-reduces the attention and the experts' outputs.)")


if __name__ == "__main__":
    main()
