"""Tokenizer speed: our `tokenize` tool beside HF's Rust `tokenizers` on the same lines, for the pipelines of
tests/oracle/hf_tokenizer_oracle.py (GPT-2, Llama 3, Qwen2 byte-level BPE; Llama 2 and Gemma byte-fallback BPE),
and beside the `sentencepiece` package (C++ under Python) for the SentencePiece-only `spm` kind, which both sides
run through libsentencepiece. Prints a table; asserts nothing (the ids themselves are checked by tokenizer_tests).

    .venv/bin/python tools/bench/tokenizer_bench.py build/bin [--repeat 5]

Lines: every line of /usr/share/common-licenses/* (about 0.7 MB of English), `--repeat` times. Both sides
encode line by line with the special tokens, on one thread (RAYON_NUM_THREADS=1): ours is
`tokenize --tokenizer DIR < lines` (tokens/s from its summary line: encode time only, stdin and stdout
included), HF's is `Tokenizer.encode(line)` per line and `encode_batch(lines)` timed in Python.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "..", "tests", "oracle", "hf_tokenizer_oracle.py")


def corpus_lines():
    lines = []
    root = "/usr/share/common-licenses"
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                lines += [l.rstrip("\n") for l in f]
    return lines


def ours(bin_dir, tok_dir, text):
    run = subprocess.run([os.path.join(bin_dir, "tokenize"), "--tokenizer", tok_dir], input=text, capture_output=True,
                         text=True, timeout=600)
    m = re.search(r"summary .*tokens=(\d+) seconds=([\d.]+)", run.stderr)
    if run.returncode != 0 or not m:
        sys.exit(f"tokenize failed:\n{run.stderr}")
    return int(m.group(1)), float(m.group(2))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("bin_dir")
    p.add_argument("--repeat", type=int, default=5)
    a = p.parse_args()
    os.environ.update(RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    from tokenizers import Tokenizer
    root = tempfile.mkdtemp(prefix="tokenizer_bench_")
    subprocess.run([sys.executable, ORACLE, "make", root], check=True, capture_output=True)
    lines = corpus_lines() * a.repeat
    text = "\n".join(lines) + "\n"
    print(f"# {len(lines)} lines ({len(text) / 1e6:.1f} MB), one thread, tokens/s (higher is better)")
    print("| pipeline | ours | HF encode (per line) | HF encode_batch | ours / HF per line |")
    print("|---|---:|---:|---:|---:|")
    for kind in ["gpt2", "llama3", "qwen2", "llama2", "gemma", "spm"]:
        d = os.path.join(root, kind)
        tokens, seconds = min((ours(a.bin_dir, d, text) for _ in range(3)), key=lambda r: r[1])
        if kind == "spm":  # the peer is sentencepiece itself, with the bos that add_bos_token asks for
            import sentencepiece
            sp = sentencepiece.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
            encode_line = lambda l: len(sp.encode(l)) + 1
            encode_batch = lambda ls: [len(ids) + 1 for ids in sp.encode(ls)]
        else:
            hf = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            encode_line = lambda l: len(hf.encode(l).ids)
            encode_batch = lambda ls: [len(e.ids) for e in hf.encode_batch(ls)]
        best_line = best_batch = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            n_line = sum(encode_line(l) for l in lines)
            best_line = min(best_line, time.perf_counter() - t0)
            t0 = time.perf_counter()
            n_batch = sum(encode_batch(lines))
            best_batch = min(best_batch, time.perf_counter() - t0)
        if not (tokens == n_line == n_batch):
            sys.exit(f"{kind}: token counts differ: ours {tokens}, HF {n_line} / {n_batch}")
        ours_tps, line_tps, batch_tps = tokens / seconds, n_line / best_line, n_batch / best_batch
        print(f"| {kind} | {ours_tps:,.0f} | {line_tps:,.0f} | {batch_tps:,.0f} | {ours_tps / line_tps:.2f} |")


if __name__ == "__main__":
    main()
