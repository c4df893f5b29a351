"""vLLM's CPU engine as a decode peer: offline LLM.generate from prompt ids (no tokenizer), greedy, prefix caching off.
Runs in vLLM's own venv (tools/bench/peers/vllm_setup.sh), never in the project's.

    .peers/vllm/bin/python tools/bench/peers/vllm_decode.py --model DIR --batch 1,8,32 [--tp 1] [--prompt-len 32]
        [--max-new-tokens 16]

--offline N: instead, N requests at once (request i's prompt: (i * 131 + j * 37) % 1000 + 5 for j < --prompt-len, as
serve_bench.py --hf-dir sends them), --max-new-tokens each, one LLM.generate: `vllm offline requests=N tokens=..
wall_s=.. tokens_per_s=..` (generated tokens over the whole call, prefill included: vLLM's offline throughput).

Decode time alone, as ours prints it: each batch size is generated twice, with 1 new token (the prefill and the
first token) and with 1 + N; a decode step of the whole batch is (t(1 + N) - t(1)) / N. One `vllm B=.. ms_per_step=..
tokens_per_s=.. prefill_ms=..` line per batch size, then a summary line.
"""
import argparse
import os
import time


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--batch", default="1,8")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--kv-cache-gb", type=int, default=4)
    p.add_argument("--offline", type=int, default=0, help="N requests at once: offline throughput")
    a = p.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(a.kv_cache_gb))
    # The cores split between the TP ranks as ours are (2 / TP threads each): "0-1" at TP 1, "0|1" at TP 2.
    cpus = sorted(os.sched_getaffinity(0))
    per = max(1, len(cpus) // a.tp)
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
        f"{cpus[r * per]}-{cpus[r * per + per - 1]}" if per > 1 else str(cpus[r * per]) for r in range(a.tp)))
    from vllm import LLM, SamplingParams

    batches = [a.offline] if a.offline else [int(b) for b in a.batch.split(",")]
    llm = LLM(model=a.model, dtype="bfloat16", tensor_parallel_size=a.tp, skip_tokenizer_init=True,
              enable_prefix_caching=False, max_model_len=a.prompt_len + a.max_new_tokens + 16,
              max_num_seqs=max(batches), seed=0)
    ids = [i * 37 % 1000 + 5 for i in range(a.prompt_len)]  # as tools/bench/decode_batch_bench.sh

    def run(batch, new_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
        prompts = [{"prompt_token_ids": list(ids)} for _ in range(batch)]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        assert all(len(o.outputs[0].token_ids) == new_tokens for o in outs)
        return elapsed

    run(max(batches), 2)  # warm-up: the first call compiles and allocates
    if a.offline:
        params = SamplingParams(temperature=0.0, max_tokens=a.max_new_tokens, ignore_eos=True, detokenize=False)
        prompts = [{"prompt_token_ids": [(i * 131 + j * 37) % 1000 + 5 for j in range(a.prompt_len)]}
                   for i in range(a.offline)]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(f"vllm offline requests={a.offline} tokens={tokens} wall_s={wall:.2f} tokens_per_s={tokens / wall:.1f}",
              flush=True)
        return
    for b in batches:
        t1 = min(run(b, 1) for _ in range(2))
        tn = min(run(b, 1 + a.max_new_tokens) for _ in range(2))
        step_ms = (tn - t1) / a.max_new_tokens * 1e3
        print(f"vllm B={b} tp={a.tp} ms_per_step={step_ms:.1f} tokens_per_s={b / step_ms * 1e3:.1f} "
              f"prefill_ms={t1 * 1e3:.0f}", flush=True)
    print(f"summary vllm tp={a.tp} batches={a.batch}", flush=True)


if __name__ == "__main__":
    main()
