"""Gradient accumulation and evaluation through llama_train's command line, against transformers.

    python tests/train/accumulate_eval_test.py <build/bin>

Checks (tiny model, TP 2 through tprun, fp32 so that the numbers compare tightly):
  - `--global-batch 4 --batch 2` (2 micro-batches per step) ends at the loss of `--batch 4` (relative 1e-5), and its
    first line says "batch=2 x 2 micro-batches";
  - `--eval-data F --eval-every 3 --eval-batches 8`: an `eval step` line after steps 3 and 6, the summary's eval_loss the
    last one; the model saved with --save-hf, loaded by transformers, gives the same mean loss over the same 16
    windows of F's bytes (window w = bytes [16 w, 16 w + 17)) within 1e-5;
  - usage errors exit 2 with one line naming the flag: --global-batch not a multiple of --batch, --eval-every without
    --eval-data, an --eval-data too short for one batch.
Exit 1 on a failure; one line per check, then a `summary` line.
"""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "inference"))
from serve_fixture import Checks  # noqa: E402

check = Checks()
SEQ = 16
SIZES = ["--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--seq-len", str(SEQ),
         "--log-every", "3", "--steps", "6", "--mixed-precision", "off", "--seed", "3"]
EVAL = os.path.join(HERE, "..", "..", "docs", "design", "layout.md")


def train(bin_dir, extra):
    return subprocess.run([os.path.join(bin_dir, "tprun"), "--nproc-per-node", "2", "llama_train", *SIZES, *extra],
                          capture_output=True, text=True, timeout=600)


def summary(stdout, key):
    m = re.search(r"summary .*\b" + key + r"=([-0-9.e+naif]+)", stdout)
    return float(m.group(1)) if m else None


def main():
    bin_dir = sys.argv[1]
    root = tempfile.mkdtemp(prefix="accumulate_eval_test_")
    out = os.path.join(root, "hf")
    acc = train(bin_dir, ["--batch", "2", "--global-batch", "4", "--eval-data", EVAL, "--eval-every", "3",
                          "--eval-batches", "8", "--save-hf", out])
    check(acc.returncode == 0 and "batch=2 x 2 micro-batches" in acc.stdout,
          "--global-batch 4 --batch 2: exit 0, 2 micro-batches per step", (acc.returncode, acc.stdout[-800:], acc.stderr[-800:]))
    if acc.returncode != 0:
        return check.finish()
    one = train(bin_dir, ["--batch", "4"])
    a, b = summary(acc.stdout, "final_loss"), summary(one.stdout, "final_loss")
    check(one.returncode == 0 and a is not None and b is not None and abs(a - b) <= 1e-5 * abs(b),
          "2 micro-batches of 2 end at the loss of one batch of 4 (relative 1e-5)", (a, b))

    evals = re.findall(r"eval step\s+(\d+)\s+loss ([0-9.]+)\s+perplexity ([0-9.]+)", acc.stdout)
    last = summary(acc.stdout, "eval_loss")
    check([int(s) for s, _, _ in evals] == [3, 6] and last is not None and abs(float(evals[-1][1]) - last) < 1e-6,
          "eval lines after steps 3 and 6; the summary's eval_loss is the last", (evals, last))

    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    transformers.utils.logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    data = list(open(EVAL, "rb").read())
    windows = torch.tensor([data[w * SEQ:w * SEQ + SEQ + 1] for w in range(8 * 2)])
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
        theirs = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten()).item()
    check(last is not None and abs(last - theirs) <= 1e-5 * abs(theirs),
          "eval_loss equals transformers' mean loss over the same 16 windows (relative 1e-5)", (last, theirs))

    short = os.path.join(root, "short.txt")
    with open(short, "w") as f:
        f.write("too short for a batch")
    for extra, needle in [(["--batch", "2", "--global-batch", "5"], "--global-batch 5 is not a multiple of --batch 2"),
                          (["--eval-every", "2"], "--eval-every needs --eval-data"),
                          (["--eval-data", short], "--eval-data")]:
        r = train(bin_dir, extra)
        lines = [l for l in r.stderr.splitlines() if "error:" in l]  # through tprun: "[rank0]: error: ..."
        check(r.returncode == 2 and len(lines) == 1 and needle in lines[0],
              f"{' '.join(extra)}: exit 2, one error line naming it", (r.returncode, r.stderr[-600:]))
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
