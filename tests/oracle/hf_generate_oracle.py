"""Greedy generation: HF transformers' LlamaForCausalLM.generate(do_sample=False) vs our llama_generate.

    python tests/oracle/hf_generate_oracle.py <build/bin>            # compare at TP 1 and TP 2
    python tests/oracle/hf_generate_oracle.py --write DIR            # save the HF model, print its greedy tokens

The HF model gets our weights without a file in between: llama::LlamaForCausalLMImpl::init_weights(seed)
draws every parameter from one CPU generator in named_parameters() order (HF's order too) with
at::normal(0, std, shape, gen) -- the same kernel as torch.normal(0, std, shape, generator=g) -- so
`llama_generate --random-init --seed S` holds bit-identical weights. Prompts of different lengths are
left-padded with an attention mask on both sides (HF's position_ids = cumsum(mask) - 1, as ours).
--write saves the model with save_pretrained (config.json + model.safetensors) for `llama_generate
--hf-dir` once HF loading is wired, and prints {"prompts": [...], "greedy": [...]} as JSON.
"""
import json
import math
import os
import re
import subprocess
import sys

SEED = 5
SIZES = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128)
OUR_FLAGS = ["--vocab", "256", "--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128"]
PROMPTS = [[72, 101, 108, 108, 111], [84, 104], [32, 116, 104, 101, 32, 109, 111]]
NEW_TOKENS = 12


def hf_model(sizes=SIZES, seed=SEED):
    """HF's LlamaForCausalLM holding what `llama_generate --random-init --seed <seed>` holds for these sizes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(**sizes, max_position_embeddings=2048, rope_theta=500000.0, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         pad_token_id=0, bos_token_id=None, eos_token_id=None)
    model = LlamaForCausalLM(config).eval()
    # llama::LlamaForCausalLMImpl::init_weights, parameter by parameter in the same order.
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            std = 0.02
            if name == "model.embed_tokens.weight":
                std = 1.0
            elif name == "lm_head.weight":
                std = 1.0 / math.sqrt(sizes["hidden_size"])
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                layer = int(re.match(r"model\.layers\.(\d+)\.", name).group(1))
                std = 0.02 / math.sqrt(2.0 * (layer + 1))
            p.copy_(torch.normal(0.0, std, size=tuple(p.shape), generator=g))
    return model


def hf_greedy(model, prompts):
    import torch
    longest = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (longest - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None)
    return out[:, longest:].tolist()


def ours(bin_dir, tp, prompts):
    cmd = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(tp), "--master-port", "0", "llama_generate",
           "--random-init", "--seed", str(SEED), *OUR_FLAGS, "--max-new-tokens", str(NEW_TOKENS), "--no-stream"]
    for p in prompts:
        cmd += ["--prompt-ids", ",".join(map(str, p))]
    run = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300)
    if run.returncode != 0:
        sys.exit(f"llama_generate failed (tp {tp}):\n{run.stdout}\n{run.stderr}")
    rows = {}
    for line in run.stdout.splitlines():
        m = re.search(r"\[(\d+)\] ([\d ]*)\|([\d ]*)$", line)  # after tprun's "[rank0]: "
        if m:
            rows[int(m.group(1))] = [int(t) for t in m.group(3).split()]
    return [rows.get(i) for i in range(len(prompts))]


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--write":
        model = hf_model()
        model.save_pretrained(sys.argv[2])
        print(json.dumps({"seed": SEED, "prompts": PROMPTS, "max_new_tokens": NEW_TOKENS,
                          "greedy": hf_greedy(model, PROMPTS)}))
        return
    bin_dir = sys.argv[1]
    model = hf_model()
    failed = False
    for prompts in ([PROMPTS[0]], PROMPTS):  # one prompt (no padding), then a left-padded batch
        want = hf_greedy(model, prompts)
        for tp in (1, 2):
            got = ours(bin_dir, tp, prompts)
            same = got == want
            failed |= not same
            print(f"batch {len(prompts)} tp {tp}: {'same' if same else 'DIFFERENT'}")
            if not same:
                print(f"  HF:   {want}\n  ours: {got}")
    if failed:
        sys.exit("greedy tokens differ from HF transformers")
    print("greedy tokens equal HF transformers' generate(do_sample=False) at TP 1 and TP 2")


if __name__ == "__main__":
    main()
