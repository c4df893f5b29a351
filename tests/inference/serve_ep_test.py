"""serve with expert parallelism, and on a GPU: a tiny real Mixtral checkpoint (4 experts, 2 per token, Qwen2's
byte-level tokenizer; serve_fixture.py) served to the `openai` client; every greedy text equals transformers'.

    python tests/inference/serve_ep_test.py <build/bin> [--device cuda]

Checked, on the CPU (or with --device cuda on cuda:0, the ranks sharing it through host-staged collectives):
  - `serve --ep 2` (experts split over 2 ranks, dense layers whole): 8 concurrent greedy completions equal
    transformers' generate;
  - `serve` at TP 2 and TP 1 of the same checkpoint: the same texts;
  - `--ep 3` on 2 ranks: the ranks exit 2, with one `error:` line (rank 0's) naming --ep and the world size, before loading.
Exit 1 on a failure; one line per check, then a `summary` line.
"""
import argparse
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_fixture import Checks, WORDS, Server, make_checkpoint  # noqa: E402

NEW_TOKENS = 10
check = Checks()


def texts_of(server, name, prompts):
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)

    def one(p):
        r = client.completions.create(model=name, prompt=p, max_tokens=NEW_TOKENS, temperature=0)
        return r.choices[0].text
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    prompts = WORDS[:8]
    root = tempfile.mkdtemp(prefix="serve_ep_")
    model_dir, tok, news = make_checkpoint(root, prompts, NEW_TOKENS, arch="mixtral")
    name = os.path.basename(model_dir)
    want = [tok.decode(n, skip_special_tokens=True) for n in news]
    device = ["--device", args.device]
    env_note = ""
    if args.device == "cuda":
        os.environ["DTENSOR_CUDA_BACKEND"] = "gloo"  # two processes on one GPU: NCCL refuses a shared device
        env_note = " (cuda, host-staged)"
    for label, world, flags in [("ep 2", 2, ["--ep", "2"]), ("tp 2", 2, []), ("tp 1", 1, [])]:
        server = Server(args.bin_dir, model_dir, tp=world, args=[*flags, *device])
        try:
            got = texts_of(server, name, prompts)
            bad = [(p, g, w) for p, g, w in zip(prompts, got, want) if g != w]
            check(not bad, f"serve {label}{env_note}: {len(prompts)} greedy texts equal transformers'", bad)
            if label == "ep 2":
                line = next(l for l in server.lines if "serving http://" in l)
                check(" ep=2 " in line and f"device={args.device}" in line, "the ready line says ep=2 and the device",
                      line)
        finally:
            server.stop()
    r = subprocess.run([os.path.join(args.bin_dir, "tprun"), "--nproc-per-node", "2", "--master-port", "0", "serve",
                        "--hf-dir", model_dir, "--port", "0", "--ep", "3"], capture_output=True, text=True, timeout=60)
    errors = [l for l in r.stderr.splitlines() if "error:" in l]
    check(r.returncode != 0 and "exited with status 2" in r.stderr and len(errors) == 1
          and "--ep 3 != world size 2" in errors[0],
          "--ep 3 on 2 ranks: the ranks exit 2, one error line naming --ep and the world size", (r.returncode, r.stderr[-600:]))
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
