"""A fine-tune keeps what it trained: llama_train --save-hf DIR writes a checkpoint transformers loads and whose logits
equal ours; a run that keeps nothing says so; the checkpoint directory holds the model's byte tokenizer, which
transformers' AutoTokenizer reads as bytes.

    python tests/train/save_hf_test.py <build/bin>

Checks (tiny model, TP 2 through tprun, bf16 mixed precision with fp32 masters as the README's main job):
  - `--save-hf DIR` after 6 steps: exit 0, "saved the model"; no "keeps no weights" note;
  - transformers' AutoModelForCausalLM.from_pretrained(DIR) loads it (fp32, as the masters); AutoTokenizer reads the
    byte tokenizer: "Héllo, world" encodes to its UTF-8 bytes and decodes back;
  - `serve --hf-dir DIR` (TP 2) greedy on 3 prompts with logprobs and return_token_ids: the ids equal transformers'
    greedy ids, every logprob equals transformers' log_softmax within 1e-4;
  - a run with neither checkpoints nor --save-hf prints the note; `--checkpoint-dir D --checkpoint-every 3` writes
    D/tokenizer.json beside D/config.json, and `serve --checkpoint D --tokenizer D` (./scripts/run.sh serve's
    command) answers with the drawn bytes as text.
Exit 1 on a failure; one line per check, then a `summary` line.
"""
import json
import os
import subprocess
import sys
import tempfile
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "inference"))
from serve_fixture import Checks, Server  # noqa: E402

check = Checks()
SIZES = ["--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--seq-len", "16",
         "--batch", "4", "--log-every", "3"]


def train(bin_dir, extra):
    return subprocess.run([os.path.join(bin_dir, "tprun"), "--nproc-per-node", "2", "llama_train", *SIZES, *extra],
                          capture_output=True, text=True, timeout=600)


def post(url, body):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main():
    bin_dir = sys.argv[1]
    root = tempfile.mkdtemp(prefix="save_hf_test_")
    out = os.path.join(root, "hf")
    r = train(bin_dir, ["--steps", "6", "--save-hf", out])
    check(r.returncode == 0 and "saved the model to " + out in r.stdout and "keeps no weights" not in r.stderr,
          "llama_train --save-hf: exit 0, saved, no keep-nothing note", (r.returncode, r.stdout[-800:], r.stderr[-800:]))
    if r.returncode != 0:
        return check.finish()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
    transformers.utils.logging.set_verbosity_error()
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    model.generation_config.eos_token_id = None  # ours run with ignore_eos
    tok = AutoTokenizer.from_pretrained(out)
    text = "Héllo, world"
    ids = tok(text)["input_ids"]
    check(ids == list(text.encode()) and tok.decode(ids) == text,
          "transformers reads the byte tokenizer: ids are the UTF-8 bytes, decode gives the text back", ids)

    server = Server(bin_dir, out, tp=2)
    bad = []
    try:
        for prompt in ["Everyone is", "The GNU General", "Permission"]:
            resp = post(server.url, {"model": os.path.basename(out), "prompt": prompt, "max_tokens": 6, "temperature": 0,
                                     "ignore_eos": True, "logprobs": 1, "return_token_ids": True})
            ours = resp["choices"][0]["token_ids"]
            ours_lp = resp["choices"][0]["logprobs"]["token_logprobs"]
            x = torch.tensor([list(prompt.encode())])
            with torch.no_grad():
                g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=6,
                                   output_scores=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
            theirs = g.sequences[0, x.shape[1]:].tolist()
            their_lp = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(g.scores, theirs)]
            worst = max(abs(a - b) for a, b in zip(ours_lp, their_lp)) if ours == theirs else None
            if ours != theirs or worst > 1e-4:
                bad.append((prompt, ours, theirs, worst))
    finally:
        server.stop()
    check(not bad, "serve --hf-dir on the saved model: greedy ids equal transformers', logprobs within 1e-4", bad)

    # The README's fine-tune (--hf-dir) saved again: transformers loads it, with the tokenizer copied along.
    tuned = os.path.join(root, "tuned")
    r = subprocess.run([os.path.join(bin_dir, "tprun"), "--nproc-per-node", "2", "llama_train", "--hf-dir", out,
                        "--seq-len", "16", "--batch", "4", "--steps", "2", "--save-hf", tuned],
                       capture_output=True, text=True, timeout=600)
    ok = r.returncode == 0
    if ok:
        again = AutoModelForCausalLM.from_pretrained(tuned)
        ok = (os.path.exists(os.path.join(tuned, "tokenizer.json")) and again.config.vocab_size == model.config.vocab_size
              and not torch.equal(again.lm_head.weight, model.lm_head.weight))
    check(ok, "a fine-tune (--hf-dir) with --save-hf: transformers loads the tuned weights and the tokenizer is there",
          (r.returncode, r.stderr[-600:]))

    r = train(bin_dir, ["--steps", "2"])
    check(r.returncode == 0 and "keeps no weights" in r.stderr, "a run that keeps nothing says so", r.stderr[-500:])
    ck = os.path.join(root, "ck")
    r = train(bin_dir, ["--steps", "3", "--checkpoint-dir", ck, "--checkpoint-every", "3"])
    check(r.returncode == 0 and os.path.exists(os.path.join(ck, "tokenizer.json")) and "keeps no weights" not in r.stderr,
          "checkpoints carry the byte tokenizer beside config.json", (r.returncode, os.listdir(ck) if os.path.isdir(ck) else None))
    # ./scripts/run.sh serve's command: the checkpoints served with the tokenizer that ships with them.
    server = Server(bin_dir, None, tp=2, weights=["--checkpoint", ck, "--tokenizer", ck], args=["--model-name", "llama"])
    try:
        resp = post(server.url, {"model": "llama", "prompt": "Everyone is", "max_tokens": 8, "temperature": 0,
                                 "return_token_ids": True})
        choice = resp["choices"][0]
    finally:
        server.stop()
    ck_tok = AutoTokenizer.from_pretrained(ck)
    check(len(choice["token_ids"]) == 8 and choice["text"] == ck_tok.decode(choice["token_ids"]),
          "serve --checkpoint D --tokenizer D (run.sh serve): the text is transformers' decode of the drawn bytes",
          (choice, ck_tok.decode(choice["token_ids"])))
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
