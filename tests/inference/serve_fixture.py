"""What the serve test and the serve benchmark share: a tiny real checkpoint saved by transformers (a random
LlamaForCausalLM whose vocabulary is a Qwen2-style byte-level BPE tokenizer's, with Qwen2.5's chat template), HF's
greedy continuations of the prompts as the oracle, and a `tprun ... serve` process started on a free port.

The checkpoint's seed is chosen so that every greedy step of every prompt has a clear top-1 (a gap of at least
MIN_GAP between the two best logits): the server batches requests differently from run to run, which changes
rounding in the last bits, never the argmax of a clear top-1.
"""
import os
import re
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ORACLE = os.path.join(HERE, "..", "oracle")
sys.path.insert(0, ORACLE)

MIN_GAP = 0.01
WORDS = ["The", "A small", "Grüße aus", "In the year", "Once upon a time", "Numbers: 1 2 3", "東京 is", "Hello, world",
         "Zürich and", "Rust or C++?", "Tensor parallel", "The quick brown fox", "Paged attention keeps",
         "Continuous batching", "Why is the sky", "Last one:"]


def make_checkpoint(root, prompts, max_new_tokens, max_positions=2048, layers=2, hidden=64, seeds=60, clear_top1=True,
                    arch="llama"):
    """Saves tokenizer + model to root/model and returns (dir, tokenizer, [HF greedy new ids per prompt]).
    clear_top1=False: the first seed, whatever its gaps (benchmarks). arch "mixtral": a mixture of 4 experts, 2 per
    token (expert parallelism)."""
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM
    from hf_chat_template_oracle import TEMPLATES
    transformers.utils.logging.set_verbosity_error()
    subprocess.run([sys.executable, os.path.join(ORACLE, "hf_tokenizer_oracle.py"), "make", root, "--kinds", "qwen2"],
                   check=True, capture_output=True)
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "qwen2"))
    tok.chat_template = TEMPLATES["qwen2_5_instruct"]
    out = os.path.join(root, "model")
    ids = [tok(p)["input_ids"] for p in prompts]
    for seed in range(seeds):
        torch.manual_seed(seed)
        sizes = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                     rms_norm_eps=1e-5, tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=0)
        if arch == "mixtral":
            model = MixtralForCausalLM(MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **sizes)).eval()
        else:
            model = LlamaForCausalLM(LlamaConfig(**sizes)).eval()
        with torch.no_grad():
            for name, w in model.named_parameters():
                w.copy_(1.0 + 0.1 * torch.randn_like(w) if "norm" in name else 0.2 * torch.randn_like(w))
        news, ok = [], True
        for p in ids:
            new, gaps = hf_greedy(model, torch, p, max_new_tokens, tok.eos_token_id)
            if clear_top1 and min(gaps) < MIN_GAP:
                ok = False
                break
            news.append(new)
        if ok:
            model.save_pretrained(out)
            tok.save_pretrained(out)
            return out, tok, news
    sys.exit("no seed without near-ties")


def hf_greedy(model, torch, prompt_ids, max_new_tokens, eos):
    x = torch.tensor([prompt_ids])
    with torch.no_grad():
        r = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                           pad_token_id=0, eos_token_id=eos, output_scores=True, return_dict_in_generate=True)
    gaps = [float(s.topk(2).values[0, 0] - s.topk(2).values[0, 1]) for s in r.scores]
    return r.sequences[0, len(prompt_ids):].tolist(), gaps


class Server:
    """`tprun --nproc-per-node TP serve --hf-dir DIR --port 0 ARGS`; .url once it prints `serving`."""

    def __init__(self, bin_dir, model_dir, tp=2, args=(), ready_timeout=120, threads=1, tprun_args=(), weights=None):
        """weights: the serve flags that name the model (default: --hf-dir model_dir)."""
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        weights = list(weights) if weights else ["--hf-dir", model_dir]
        self.proc = subprocess.Popen([os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(tp), "--master-port", "0",
                                      *tprun_args, "serve", *weights, "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.lines, self.err_lines = [], []
        ready = threading.Event()

        def pump(stream, sink, watch):
            for line in stream:
                sink.append(line.rstrip("\n"))
                if watch and re.search(r"serving http://", line):
                    ready.set()
        self.threads = [threading.Thread(target=pump, args=(self.proc.stdout, self.lines, True), daemon=True),
                        threading.Thread(target=pump, args=(self.proc.stderr, self.err_lines, False), daemon=True)]
        for t in self.threads:
            t.start()
        deadline = time.time() + ready_timeout
        while not ready.wait(0.1):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                raise RuntimeError("serve did not start:\n" + "\n".join(self.lines + self.err_lines)[-3000:])
        line = next(l for l in self.lines if "serving http://" in l)
        self.url = re.search(r"(http://\S+)", line).group(1)

    def wait_err(self, pred, timeout=20):
        """The stderr lines that satisfy pred, waiting up to `timeout` s for a first one: a line reaches us through
        tprun's relay and a reader thread, so it can trail an HTTP answer that serve sent after writing it."""
        deadline = time.time() + timeout
        while True:
            found = [l for l in list(self.err_lines) if pred(l)]
            if found or time.time() > deadline or self.proc.poll() is not None:
                return found or [l for l in list(self.err_lines) if pred(l)]
            time.sleep(0.05)

    def rank_pid(self, rank):
        """The pid of rank `rank` (tprun's child whose environment says RANK=rank)."""
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in out:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(pid)
        raise RuntimeError(f"no rank {rank} among tprun's children {out}")

    def stop(self, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(2)  # SIGINT
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for t in self.threads:
            t.join(5)
        return self.proc.returncode


class Checks:
    """The serve tests' report: one line per check ("ok LABEL" / "FAIL LABEL" and the detail), then a summary line."""

    def __init__(self):
        self.count = self.failures = 0

    def __call__(self, ok, label, detail=""):
        self.count += 1
        self.failures += not ok
        print(("ok " if ok else "FAIL ") + label + ("" if ok else "\n  " + str(detail)[:2000]), flush=True)

    def finish(self):
        """Prints the summary line; the exit status (1 on any failure)."""
        print(f"summary checks={self.count} failures={self.failures}")
        return 1 if self.failures else 0

