"""The plan search against the hand-written plans, measured: for each model, `llama_plan --search --json` picks a
plan; then llama_train at TP 2 runs torchtitan's plan (SP + loss parallel, the default), HF's plan and `--plan auto`
(the searched one), interleaved over ROUNDS rounds, and the table gives predicted and measured step times. Last, the
memory-budget case: a dp 2 x tp 2 mesh whose hand plan (DDP) exceeds the budget, and what the search picks.

    python tools/bench/plan_search_bench.py [--bin build/bin] [--steps 30] [--rounds 3] [--quick]

Models: llama_train's default, a larger Llama, and two other families (Qwen2: q/k/v biases; Qwen3: per-head q/k
norms), the last two as tiny checkpoints saved by transformers (random weights, byte vocabulary) that llama_train
fine-tunes with --hf-dir. Ends with a `summary` line: the worst searched / best-hand ratio.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
COST = ["--mm-gflops", "94", "--memory-gbps", "25", "--dtensor-op-us", "1.9"]  # llama_train --plan auto's fixed cost model (search.cpp)


def family_dir(root, family):
    import torch
    import transformers
    transformers.utils.logging.set_verbosity_error()
    torch.manual_seed(0)
    common = dict(vocab_size=256, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False)
    if family == "qwen2":
        config = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.Qwen3Config(head_dim=32, **common)
        model = transformers.Qwen3ForCausalLM(config)
    out = os.path.join(root, family)
    model.save_pretrained(out)
    return out


def run(cmd, timeout=900):
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def search(bin_dir, model_flags, shape_flags, extra=()):
    return json.loads(run([os.path.join(bin_dir, "llama_plan"), "--search", "--json", *COST,
                           *model_flags, *shape_flags, *extra]))


def measure(bin_dir, model_train_flags, shape_flags, plan_flags, steps):
    out = run([os.path.join(bin_dir, "tprun"), "--nproc-per-node", "2", "--master-port", "0",
               os.path.join(bin_dir, "llama_train"), *model_train_flags, *shape_flags, *plan_flags, "--steps", str(steps),
               "--log-every", str(steps)])
    m = re.search(r"median_step_ms=([0-9.]+)", out)
    chosen = re.search(r"plan auto: (\S+),", out)
    return float(m.group(1)), chosen.group(1) if chosen else None


HAND = ["torchtitan+sp+loss_parallel", "hf"]  # llama_train's default (torchtitan's plan) and HF's tp_plan


def flags_of(knobs):
    if knobs["tp_plan"] == "hf":
        return ["--plan", "hf"]
    flags = ["--plan", "torchtitan", "--sequence-parallel" if knobs["sequence_parallel"] == "on" else "--no-sequence-parallel",
             "--loss-parallel" if knobs["loss_parallel"] == "on" else "--no-loss-parallel"]
    return flags + (["--async-tp"] if knobs["async_tp"] == "on" else [])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the default model only, one round")
    ap.add_argument("--only", default="", help="models whose name contains this")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="plan_search_bench_")
    models = [("llama default", [], [], ["--seq-len", "64", "--batch", "4"]),
              ("llama larger", ["--dim", "512", "--layers", "8", "--heads", "8", "--kv-heads", "4", "--ffn-dim", "1536"],
               ["--dim", "512", "--layers", "8", "--heads", "8", "--kv-heads", "4", "--ffn-dim", "1536"],
               ["--seq-len", "128", "--batch", "4"])]
    if args.quick:
        models, args.rounds = models[:1], 1
    else:
        for fam in ("qwen2", "qwen3"):
            d = family_dir(root, fam)
            models.append((fam, ["--hf-config", os.path.join(d, "config.json")], ["--hf-dir", d],
                           ["--seq-len", "64", "--batch", "4"]))
    models = [m for m in models if args.only in m[0]]
    # Each round runs every candidate once; a candidate's measured time is its best round's median step (the round
    # least disturbed by the machine's other load: one llama_train varies 5-20% between runs here), the median of
    # the rounds beside it. The ratio to the best hand plan uses the best rounds.
    print(f"# plan search vs hand plans, TP 2, {args.steps} steps, {args.rounds} interleaved rounds "
          f"(cost model: {' '.join(COST)}, comm_bench's shm numbers)")
    print(f"{'model':<14} {'plan':<44} {'predicted_ms':>12} {'best_ms':>10} {'median_ms':>10}")
    worst = 0.0
    for name, plan_flags, train_flags, shape in models:
        res = search(args.bin, plan_flags, shape + ["--tp", "2"])
        ran = [c for c in res["candidates"] if c.get("ran")]
        times = {c["name"]: [] for c in ran}
        auto_choice = None
        for r in range(args.rounds):
            for c in ran:
                times[c["name"]].append(measure(args.bin, train_flags, shape, flags_of(c["knobs"]), args.steps)[0])
            if r == 0:  # llama_train --plan auto makes the same choice as llama_plan --search
                auto_choice = measure(args.bin, train_flags, shape, ["--plan", "auto"], 3)[1]
        best = {k: min(v) for k, v in times.items()}
        med = {k: statistics.median(v) for k, v in times.items()}
        for c in ran:
            mark = " <- searched" if c["name"] == res["plan_name"] else (" <- hand" if c["name"] in HAND else "")
            print(f"{name:<14} {c['name'] + mark:<44} {c['predicted_step_ms']:>12.2f} {best[c['name']]:>10.2f} "
                  f"{med[c['name']]:>10.2f}")
        best_hand = min(best[h] for h in HAND if h in best)
        ratio = best[res["plan_name"]] / best_hand
        worst = max(worst, ratio)
        fastest = min(best, key=best.get)
        print(f"{name:<14} searched {res['plan_name']} (llama_train --plan auto: {auto_choice}); measured / best hand plan "
              f"{ratio:.3f}; fastest measured: {fastest}", flush=True)
    # The memory budget: dp 2 x tp 2; the hand plan (torchtitan, DDP) against a budget below its peak.
    res = search(args.bin, [], ["--seq-len", "64", "--batch", "4", "--tp", "2", "--dp", "2"])
    hand = next(c for c in res["candidates"] if c["knobs"].get("sequence_parallel") == "on" and
                c["knobs"].get("loss_parallel") == "on" and c["knobs"].get("async_tp") == "off" and
                c["knobs"]["data_parallel"] == "ddp")
    budget_mb = int(hand["predicted_peak_bytes_per_rank"] * 0.8 / 2 ** 20)
    fit = search(args.bin, [], ["--seq-len", "64", "--batch", "4", "--tp", "2", "--dp", "2"],
                 ["--memory-budget-mb", str(budget_mb)])
    print(f"memory budget {budget_mb} MiB per rank on dp 2 x tp 2: hand plan {hand['name']} peaks at "
          f"{hand['predicted_peak_bytes_per_rank'] / 2 ** 20:.1f} MiB; searched {fit['plan_name']} peaks at "
          f"{fit['predicted_peak_bytes_per_rank'] / 2 ** 20:.1f} MiB, predicted {fit['predicted_step_ms']:.2f} ms")
    print(f"summary worst_searched_over_best_hand={worst:.3f} budget_mb={budget_mb} "
          f"budget_fits={int(fit['predicted_peak_bytes_per_rank'] <= budget_mb * 2 ** 20)}")


if __name__ == "__main__":
    main()
