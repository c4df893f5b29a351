"""Text in, text out: `llama_generate --hf-dir DIR --prompt TEXT` with the checkpoint's tokenizer against
transformers (AutoTokenizer + LlamaForCausalLM.generate + decode) on the same files.

    python tests/oracle/hf_text_generate_oracle.py <build/bin>

For the Llama 3 and Llama 2 tokenizer pipelines of hf_tokenizer_oracle.py: a tiny random LlamaForCausalLM whose
vocabulary is the tokenizer's, saved with save_pretrained beside the tokenizer files; a seed whose greedy steps
all have a clear top-1 (no near-ties) is chosen. Both sides stop at the tokenizer's eos. Checks, at TP 1 and TP 2 (tprun), for a prompt with non-ASCII
text: the ids of the prompt are HF's, the decoded continuation is HF's, and the streamed text (rank 0's stream
line) is the prompt followed by that continuation, with multi-byte characters never split. Exit 1 on a
mismatch; prints one line per check and a `summary` line.
"""
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "Grüße aus Zürich: 東京 🚀 and the"
NEW_TOKENS = 16
MIN_GAP = 0.05


def make_model(tok_dir, out, torch, transformers):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
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
            return ids[0].tolist(), new, tok.decode(new, skip_special_tokens=True), tok.decode(ids[0].tolist(), skip_special_tokens=True)
    sys.exit("no seed without near-ties")


def main():
    bin_dir = sys.argv[1]
    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.utils.logging.set_verbosity_error()
    root = tempfile.mkdtemp(prefix="hf_text_generate_")
    subprocess.run([sys.executable, os.path.join(HERE, "hf_tokenizer_oracle.py"), "make", root, "--kinds", "llama3,llama2"],
                   check=True, capture_output=True)
    failures = checks = 0
    for kind in ["llama3", "llama2"]:
        out = os.path.join(root, kind + "_model")
        prompt_ids, new_ids, new_text, prompt_text = make_model(os.path.join(root, kind), out, torch, transformers)
        ids_run = subprocess.run([os.path.join(bin_dir, "tokenize"), "--tokenizer", out], input=PROMPT + "\n",
                                 capture_output=True, text=True, timeout=60)
        checks += 1
        if [int(t) for t in ids_run.stdout.split()] != prompt_ids:
            failures += 1
            print(f"FAIL {kind}: prompt ids {ids_run.stdout.strip()} != HF {prompt_ids}")
        for tp in (1, 2):
            cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(tp), "--master-port", "0", "llama_generate",
                   "--hf-dir", out, "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS)]
            run = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                                 timeout=300)
            lines = [re.sub(r"^\[rank0\]: ", "", l) for l in run.stdout.splitlines() if l.startswith("[rank0]: ")]
            streamed = lines[1] if len(lines) > 1 else ""
            final = next((l for l in lines if l.startswith("[0] ")), "")
            ok = run.returncode == 0 and final == f"[0] {prompt_text}|{new_text}" and streamed == prompt_text + new_text
            checks += 1
            failures += not ok
            print(f"{'ok' if ok else 'FAIL'} {kind} tp={tp}: {final!r}" + ("" if ok else f"\n  want [0] {prompt_text}|{new_text}\n  streamed {streamed!r}\n{run.stderr[-2000:]}"))
    print(f"summary checks={checks} failures={failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
