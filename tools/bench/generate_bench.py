"""Generation speed: llama_generate at TP 1 and 2, batch 1 and 8, on the default model and a larger one,
beside HF transformers generating the same model (the same weights: tests/oracle/hf_generate_oracle.py)
on CPU in the same run. Prints a table; asserts nothing.

    .venv/bin/python tools/bench/generate_bench.py build/bin [--new-tokens 32] [--prompt-len 16]

Ours: the summary line of `tprun --nproc-per-node TP llama_generate --random-init` (prefill_ms; ms_per_token
= decode time per step after the first token, every sequence of the batch advancing one token; tokens_per_s
= batch tokens per second over those steps). Collectives: Gloo (the only backend today). HF: generate() with
greedy decoding and its KV cache, torch threads = the TP degree (the cores our ranks use), timed the same way:
prefill = generate(max_new_tokens=1), per token = (generate(N) - prefill) / (N - 1).
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "oracle"))
from hf_generate_oracle import hf_model  # noqa: E402

MODELS = {
    "default": dict(vocab_size=256, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                    num_key_value_heads=4, intermediate_size=768),
    "larger": dict(vocab_size=256, hidden_size=768, num_hidden_layers=8, num_attention_heads=12,
                   num_key_value_heads=4, intermediate_size=2048),
}
SEED = 3


def flags(sizes):
    return ["--vocab", str(sizes["vocab_size"]), "--dim", str(sizes["hidden_size"]),
            "--layers", str(sizes["num_hidden_layers"]), "--heads", str(sizes["num_attention_heads"]),
            "--kv-heads", str(sizes["num_key_value_heads"]), "--ffn-dim", str(sizes["intermediate_size"])]


def prompt(n):
    return [(37 * i + 11) % 200 + 32 for i in range(n)]


def ours(bin_dir, sizes, tp, batch, args):
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(tp), "--master-port", "0", "llama_generate",
           "--random-init", "--seed", str(SEED), *flags(sizes), "--prompt-ids", ",".join(map(str, prompt(args.prompt_len))),
           "--batch", str(batch), "--max-new-tokens", str(args.new_tokens), "--no-stream"]
    run = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600)
    m = re.search(r"summary (.*)$", run.stdout, re.M)  # after tprun's "[rank0]: "
    if run.returncode != 0 or not m:
        sys.exit(f"llama_generate failed:\n{run.stdout}\n{run.stderr}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def hf(model, batch, threads, args):
    import torch
    torch.set_num_threads(threads)
    ids = torch.tensor([prompt(args.prompt_len)] * batch)
    mask = torch.ones_like(ids)

    def run(n):
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                           pad_token_id=0, eos_token_id=None)
        return (time.perf_counter() - t0) * 1000

    run(2)  # warm-up
    prefill = min(run(1) for _ in range(3))
    total = min(run(args.new_tokens) for _ in range(2))
    per_token = (total - prefill) / (args.new_tokens - 1)
    return {"prefill_ms": prefill, "ms_per_token": per_token, "tokens_per_s": batch * 1000 / per_token}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("bin_dir")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--models", default="default,larger")
    args = parser.parse_args()
    print(f"# generation, prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, greedy, CPU")
    print(f"{'model':<8} {'params':>8} {'batch':>5} {'who':<22} {'prefill_ms':>10} {'ms/token':>9} {'tokens/s':>9}")
    for name in args.models.split(","):
        sizes = MODELS[name]
        model = hf_model(sizes, SEED)
        params = sum(p.numel() for p in model.parameters())
        for batch in (1, 8):
            rows = []
            for tp in (1, 2):
                rows.append((f"ours TP{tp} gloo", ours(args.bin_dir, sizes, tp, batch, args)))
            for threads in (1, 2):
                rows.append((f"HF transformers {threads}thr", hf(model, batch, threads, args)))
            for who, r in rows:
                print(f"{name:<8} {params / 1e6:>7.1f}M {batch:>5} {who:<22} {r['prefill_ms']:>10.2f} "
                      f"{r['ms_per_token']:>9.2f} {r['tokens_per_s']:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
