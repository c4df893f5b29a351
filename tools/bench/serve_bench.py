"""Load test of `serve` beside transformers' generate on the same weights (loopback only, bounded in count and time).

    python tools/bench/serve_bench.py [--bin build/bin] [--clients 8] [--requests 4] [--max-tokens 32]
                                      [--hidden 256] [--layers 4] [--tp 1,2] [--shared-prefix WORDS]

A random LlamaForCausalLM saved by transformers with a Qwen2-style tokenizer (tests/inference/serve_fixture.py). Each of
CLIENTS threads sends REQUESTS completions one after another (prompts from the fixture's list, temperature 0,
ignore_eos, MAX_TOKENS each) to `tprun --nproc-per-node TP serve`. Then transformers serves the same requests
two ways on the same files: one generate() per request (no batching: what a loop around generate gives), and
static batches of CLIENTS left-padded prompts (batched, but a batch waits for its longest member). Prints per
setup: requests, generated tokens, wall time, tokens/s, and request latency p50 / p99; then a `summary` line.
The machine's 2 cores: our TP 2 runs 2 single-threaded ranks; TP 1 and transformers use 2 threads.

--speculative K: the prompts repeat themselves (each word list 8 times), and ours runs twice per TP, with prompt-lookup
speculative decoding of K tokens (--speculative-config ngram) and without; the rows add the draft tokens accepted.

--reference-attention: ours runs twice per TP, the second time with DTENSOR_FAST_KERNELS=0: a step's attention by the
reference route (every sequence's keys gathered under a block-diagonal mask) instead of each sequence over its own
blocks (inference/paged_attention.h). The model is fp32, so the switch changes nothing else. --skip-transformers
leaves out transformers' rows.

--hf-dir DIR: a real checkpoint instead of the fixture (tools/bench/real_size_checkpoint.py writes random ones of real
shapes, without a tokenizer): ours serves it in bf16 (--max-model-len 512, prefix caching off) with the fixture's
tokenizer beside it, every request a prompt of --prompt-len token ids, and asks for the chosen tokens' logprobs so
that each token arrives in its own chunk (the random weights' tokens mostly decode to no text): time to first token
and inter-token latency p50 / p99 from the chunks' arrival. --vllm: then vLLM's CPU engine (its own venv,
tools/bench/peers/vllm_setup.sh) generates the same requests offline (LLM.generate, all at once, the same token ids,
max tokens and greedy), its throughput beside ours. transformers is left out with --hf-dir.

--shared-prefix N: every prompt begins with the same system prompt of N words (a chat server's typical load), and
ours runs twice per TP, with automatic prefix caching (the default) and with --no-enable-prefix-caching; the rows
add time to first token (p50, streamed).
"""
import argparse
import concurrent.futures
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "inference"))
from serve_fixture import WORDS, Server, make_checkpoint  # noqa: E402


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def row(name, n, tokens, wall, lat):
    print(f"{name:<34} {n:>5} {tokens:>7} {wall:>8.2f} {tokens / wall:>9.1f} {pct(lat, 0.5) * 1000:>9.1f} "
          f"{pct(lat, 0.99) * 1000:>9.1f}", flush=True)
    return tokens / wall


def prompt_of(args, i):
    word = WORDS[i % len(WORDS)]
    if args.speculative:
        return " ".join([word] * 8)
    return (SYSTEM_WORDS * (args.shared_prefix // len(SYSTEM_WORDS) + 1))[:args.shared_prefix] + [word] \
        if args.shared_prefix else word


SYSTEM_WORDS = "You are a helpful assistant . Answer briefly and cite what you use .".split()


def prompt_ids(args, i):
    """Request i's prompt in --hf-dir mode: --prompt-len token ids, different per request (no shared prefix)."""
    return [(i * 131 + j * 37) % 1000 + 5 for j in range(args.prompt_len)]


def ours(bin_dir, model_dir, name, tp, args, serve_args=(), label="continuous batching", env=None):
    import openai
    threads = 1 if tp > 1 else 2
    if args.hf_dir:
        serve_args = tuple(serve_args) + ("--tokenizer", args.tokenizer_dir, "--dtype", "bfloat16", "--max-model-len",
                                          "512", "--no-enable-prefix-caching", "--max-num-seqs",
                                          str(max(args.max_num_seqs, args.clients)))
    elif args.max_num_seqs:
        serve_args = tuple(serve_args) + ("--max-num-seqs", str(args.max_num_seqs))
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        server = Server(bin_dir, model_dir, tp=tp, threads=threads, args=serve_args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=600, max_retries=0)
        client.completions.create(model=name, prompt=[5, 6, 7] if args.hf_dir else "warm up", max_tokens=4, temperature=0)

        def one_client(c):
            out = []
            for r in range(args.requests):
                if args.hf_dir:
                    p, extra = prompt_ids(args, c * args.requests + r), {"logprobs": 0}
                else:
                    p, extra = prompt_of(args, c * args.requests + r), {}
                    p = " ".join(p) if isinstance(p, list) else p
                t = time.perf_counter()
                stream = client.completions.create(model=name, prompt=p, max_tokens=args.max_tokens, temperature=0,
                                                   stream=True, stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}, **extra)
                arrivals, tokens = [], 0
                for chunk in stream:
                    if chunk.choices and (chunk.choices[0].text or (args.hf_dir and chunk.choices[0].logprobs)):
                        arrivals.append(time.perf_counter() - t)
                    if chunk.usage:
                        tokens = chunk.usage.completion_tokens
                out.append((time.perf_counter() - t, tokens, arrivals[0] if arrivals else 0.0,
                            [b - a for a, b in zip(arrivals, arrivals[1:])]))
            return out
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.clients) as pool:
            results = [x for per in pool.map(one_client, range(args.clients)) for x in per]
        wall = time.perf_counter() - t0
        import urllib.request
        text = urllib.request.urlopen(server.url + "/metrics", timeout=30).read().decode()
        got = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("serve_spec_decode")}
        spec = (got.get("serve_spec_decode_draft_tokens_total", 0), got.get("serve_spec_decode_accepted_tokens_total", 0))
        spec = spec if "ngram" in label else None
    finally:
        server.stop()
    lat = [r[0] for r in results]
    rate = row(f"serve tp={tp} ({label})", len(results), sum(r[1] for r in results), wall, lat)
    if spec:
        print(f"{'':<34} draft tokens accepted {spec[1]:.0f} of {spec[0]:.0f}", flush=True)
    ttft = [r[2] for r in results]
    print(f"{'':<34} time to first token p50 {pct(ttft, 0.5) * 1000:.1f} ms p99 {pct(ttft, 0.99) * 1000:.1f} ms", flush=True)
    itl = [x for r in results for x in r[3]]
    if itl:
        print(f"{'':<34} inter-token latency p50 {pct(itl, 0.5) * 1000:.1f} ms p99 {pct(itl, 0.99) * 1000:.1f} ms "
              f"({len(itl)} gaps)", flush=True)
    return rate


def vllm_side(args, tp):
    """vLLM's CPU engine, offline: every request at once through LLM.generate (peers/vllm_decode.py --offline)."""
    import subprocess
    py = subprocess.run([os.path.join(HERE, "peers", "vllm_setup.sh")], capture_output=True, text=True,
                        check=True).stdout.strip()
    n = args.clients * args.requests
    proc = subprocess.run([py, os.path.join(HERE, "peers", "vllm_decode.py"), "--model", args.hf_dir, "--tp", str(tp),
                           "--offline", str(n), "--prompt-len", str(args.prompt_len), "--max-new-tokens",
                           str(args.max_tokens)], capture_output=True, text=True, timeout=1800)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("vllm offline")), None)
    if line is None:
        raise RuntimeError("vLLM's offline run printed no result:\n" + (proc.stdout + proc.stderr)[-3000:])
    got = dict(kv.split("=") for kv in line.split()[2:])
    print(f"{f'vllm tp={tp} (offline LLM.generate)':<34} {n:>5} {int(got['tokens']):>7} {float(got['wall_s']):>8.2f} "
          f"{float(got['tokens_per_s']):>9.1f}", flush=True)
    return float(got["tokens_per_s"])


def transformers_side(model_dir, args):
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    prompts = [prompt_of(args, i) for i in range(args.clients * args.requests)]
    prompts = [" ".join(p) if isinstance(p, list) else p for p in prompts]
    kw = dict(do_sample=False, max_new_tokens=args.max_tokens, min_new_tokens=args.max_tokens, pad_token_id=0)
    with torch.no_grad():
        model.generate(**tok(["warm up"], return_tensors="pt"), max_new_tokens=4, do_sample=False, pad_token_id=0)
        lat, tokens, t0 = [], 0, time.perf_counter()
        for p in prompts:
            t = time.perf_counter()
            out = model.generate(**tok([p], return_tensors="pt"), **kw)
            lat.append(time.perf_counter() - t)
            tokens += out.shape[1] - len(tok(p)["input_ids"])
        r1 = row("transformers generate, one by one", len(prompts), tokens, time.perf_counter() - t0, lat)
        tok.padding_side = "left"
        lat, tokens, t0 = [], 0, time.perf_counter()
        for i in range(0, len(prompts), args.clients):
            batch = prompts[i:i + args.clients]
            enc = tok(batch, return_tensors="pt", padding=True)
            t = time.perf_counter()
            out = model.generate(**enc, **kw)
            lat += [time.perf_counter() - t] * len(batch)
            tokens += (out.shape[1] - enc["input_ids"].shape[1]) * len(batch)
        r2 = row(f"transformers generate, batches of {args.clients}", len(prompts), tokens, time.perf_counter() - t0, lat)
    return r1, r2


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tp", default="1,2")
    ap.add_argument("--shared-prefix", type=int, default=0, help="words of a system prompt every request begins with")
    ap.add_argument("--speculative", type=int, default=0, help="prompt-lookup draft tokens (a repetitive workload)")
    ap.add_argument("--reference-attention", action="store_true",
                    help="ours again with DTENSOR_FAST_KERNELS=0 (the paged step's reference attention)")
    ap.add_argument("--skip-transformers", action="store_true", help="leave out transformers' rows")
    ap.add_argument("--max-num-seqs", type=int, default=0, help="serve's --max-num-seqs (0: its default, 16)")
    ap.add_argument("--hf-dir", default="", help="a real checkpoint to serve (bf16) instead of the fixture")
    ap.add_argument("--prompt-len", type=int, default=32, help="--hf-dir: prompt token ids per request")
    ap.add_argument("--vllm", action="store_true", help="--hf-dir: vLLM's offline throughput on the same requests")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="serve_bench_")
    model_dir, _, _ = make_checkpoint(root, WORDS[:1], 1, layers=args.layers, hidden=args.hidden, clear_top1=False)
    if args.hf_dir:
        args.tokenizer_dir, model_dir, args.skip_transformers = model_dir, os.path.abspath(args.hf_dir), True
        cpu = os.popen("lscpu | sed -n 's/^Model name: *//p'").read().strip()
        model = os.popen("lscpu | sed -n 's/^Model: *//p'").read().strip()
        print(f"# {args.hf_dir}: {args.prompt_len}-token prompts; {cpu} (model {model}), {os.cpu_count()} cores")
    name = os.path.basename(model_dir)
    print(f"# serve load test: {args.clients} clients x {args.requests} requests, {args.max_tokens} tokens each, "
          + (f"a shared {args.shared_prefix}-word system prompt, " if args.shared_prefix else "") +
          f"{os.path.basename(model_dir) if args.hf_dir else f'Llama hidden={args.hidden} layers={args.layers}'} (CPU, 2 cores)")
    print(f"{'setup':<34} {'reqs':>5} {'tokens':>7} {'wall_s':>8} {'tok/s':>9} {'p50_ms':>9} {'p99_ms':>9}")
    rates = {}
    for tp in [int(x) for x in args.tp.split(",")]:
        rates[f"serve_tp{tp}"] = ours(args.bin, model_dir, name, tp, args)
        if args.hf_dir and args.vllm:
            rates[f"vllm_tp{tp}_offline"] = vllm_side(args, tp)
        if args.speculative:
            config = f'{{"method": "ngram", "num_speculative_tokens": {args.speculative}, "prompt_lookup_min": 1}}'
            rates[f"serve_tp{tp}_speculative"] = ours(args.bin, model_dir, name, tp, args,
                                                      ["--speculative-config", config], f"ngram speculation {args.speculative}")
        if args.reference_attention:
            rates[f"serve_tp{tp}_reference_attention"] = ours(args.bin, model_dir, name, tp, args, (),
                                                              "reference attention", {"DTENSOR_FAST_KERNELS": "0"})
        if args.shared_prefix:
            rates[f"serve_tp{tp}_no_prefix_caching"] = ours(args.bin, model_dir, name, tp, args,
                                                            ["--no-enable-prefix-caching"], "no prefix caching")
    if not args.skip_transformers:
        rates["hf_one_by_one"], rates["hf_batched"] = transformers_side(model_dir, args)
    print("summary " + " ".join(f"{k}_tokens_per_s={v:.1f}" for k, v in rates.items()))


if __name__ == "__main__":
    main()
