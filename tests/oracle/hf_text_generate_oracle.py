"""Text in, text out: `llama_generate --hf-dir DIR --prompt TEXT` (and `--chat TEXT`) with the checkpoint's
tokenizer against transformers (AutoTokenizer + LlamaForCausalLM.generate + decode) on the same files.

    python tests/oracle/hf_text_generate_oracle.py <build/bin>

For tokenizers of hf_tokenizer_oracle.py (the Llama 3, Llama 2, Gemma pipelines and a SentencePiece-only
tokenizer.model) and, for --chat, the Qwen2 and Gemma ones with the real Qwen2.5 and Gemma chat templates of
hf_chat_template_oracle.py: a tiny random LlamaForCausalLM whose vocabulary is the tokenizer's, saved with
save_pretrained beside the tokenizer files; a seed whose greedy steps all have a clear top-1 (no near-ties) is
chosen. Both sides stop at the tokenizer's eos. Checks, with tprun at the TP degrees of RUNS:
  - the prompt's ids are HF's (`tokenize` for --prompt: tok(PROMPT); for --chat, apply_chat_template's text
    encoded without added special tokens, as apply_chat_template(tokenize=True) does);
  - the decoded continuation is HF's decode(new ids, skip_special_tokens=True);
  - the streamed text (rank 0's stream line) is HF's decode(prompt + new ids, skip_special_tokens=True), which is
    what transformers' TextStreamer prints: no multi-byte character split, no leading space lost.
Exit 1 on a mismatch; prints one line per check and a `summary` line.
"""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
PROMPT = "Grüße aus Zürich: 東京 🚀 and the"
CHAT = "Wie geht's? Antworte kurz 🙂"
SYSTEM = "You are terse."
NEW_TOKENS = 16
MIN_GAP = 0.05
# (tokenizer kind, chat template name or None for --prompt, TP degrees)
RUNS = [("llama3", None, (1, 2)), ("llama2", None, (1, 2)), ("spm", None, (2,)), ("gemma", None, (2,)),
        ("qwen2", "qwen2_5_instruct", (1, 2)), ("gemma", "gemma_it", (2,))]


def prompt_ids(tok, chat_template):
    if chat_template is None:
        return tok(PROMPT)["input_ids"]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": CHAT}]
    if "System role not supported" in chat_template:  # Gemma: no system message
        messages = messages[1:]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False)["input_ids"]


def make_model(tok_dir, out, chat_template, torch, transformers):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(tok_dir)
    if chat_template is not None:
        tok.chat_template = chat_template
    ids = torch.tensor([prompt_ids(tok, chat_template)])
    for seed in range(50):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                             rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                             eos_token_id=None, pad_token_id=0)
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():
            for name, w in model.named_parameters():
                w.copy_(1.0 + 0.1 * torch.randn_like(w) if "norm" in name else 0.2 * torch.randn_like(w))
            out_ids = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=tok.eos_token_id,
                                     output_scores=True, return_dict_in_generate=True)
        gaps = [float((s.topk(2).values[0, 0] - s.topk(2).values[0, 1])) for s in out_ids.scores]
        if min(gaps) >= MIN_GAP:
            model.save_pretrained(out)
            tok.save_pretrained(out)
            new = out_ids.sequences[0, ids.shape[1]:].tolist()
            prompt = ids[0].tolist()
            return (prompt, new, tok.decode(new, skip_special_tokens=True), tok.decode(prompt, skip_special_tokens=True),
                    tok.decode(prompt + new, skip_special_tokens=True))
    sys.exit("no seed without near-ties")


def main():
    bin_dir = sys.argv[1]
    import torch
    import transformers
    from hf_chat_template_oracle import TEMPLATES
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    root = tempfile.mkdtemp(prefix="hf_text_generate_")
    kinds = sorted({kind for kind, _, _ in RUNS})
    subprocess.run([sys.executable, os.path.join(HERE, "hf_tokenizer_oracle.py"), "make", root, "--kinds", ",".join(kinds)],
                   check=True, capture_output=True)
    failures = checks = 0
    for kind, chat, tps in RUNS:
        label = kind + (f"+{chat}" if chat else "")
        out = os.path.join(root, label + "_model")
        template = TEMPLATES[chat] if chat else None
        ids, new_ids, new_text, prompt_text, streamed_text = make_model(os.path.join(root, kind), out, template, torch,
                                                                        transformers)
        if chat is None:
            ids_run = subprocess.run([os.path.join(bin_dir, "tokenize"), "--tokenizer", out], input=PROMPT + "\n",
                                     capture_output=True, text=True, timeout=60)
            checks += 1
            if [int(t) for t in ids_run.stdout.split()] != ids:
                failures += 1
                print(f"FAIL {label}: prompt ids {ids_run.stdout.strip()} != HF {ids}")
            prompt_flags = ["--prompt", PROMPT]
        else:
            prompt_flags = ["--chat", CHAT] + ([] if "System role not supported" in template else ["--system", SYSTEM])
        for tp in tps:
            cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(tp), "--master-port", "0", "llama_generate",
                   "--hf-dir", out, *prompt_flags, "--max-new-tokens", str(NEW_TOKENS)]
            run = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                                 timeout=300)
            out_lines = [re.sub(r"^\[rank0\]: ", "", l) for l in run.stdout.split("\n") if l.startswith("[rank0]: ")]
            # The stream line is the one before the "[0] " result line (a chat prompt's text may hold newlines:
            # then the streamed text spans lines, joined back here).
            final_at = next((i for i, l in enumerate(out_lines) if l.startswith("[0] ")), len(out_lines))
            streamed = "\n".join(out_lines[1:final_at])
            final = "\n".join(out_lines[final_at:final_at + 1 + prompt_text.count("\n") + new_text.count("\n")])
            summary = next((l for l in out_lines if l.startswith("summary ")), "")
            tokens = re.search(r"prompt_tokens=(\d+)", summary)
            ok = (run.returncode == 0 and final == f"[0] {prompt_text}|{new_text}" and streamed == streamed_text
                  and tokens is not None and int(tokens.group(1)) == len(ids))
            checks += 1
            failures += not ok
            print(f"{'ok' if ok else 'FAIL'} {label} tp={tp}: {final[-80:]!r}" + ("" if ok else
                  f"\n  want [0] {prompt_text}|{new_text}\n  streamed {streamed!r}\n  want     {streamed_text!r}\n"
                  f"  {summary}\n{run.stderr[-2000:]}"))
    print(f"summary checks={checks} failures={failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
