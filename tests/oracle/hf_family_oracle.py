"""Hugging Face transformers on the other side of the C++ tests that load tiny random checkpoints of several model
families (Llama and its RoPE scalings, Mistral, Qwen2, Qwen3) and compare logits and greedy tokens.

    python hf_family_oracle.py make ROOT [--cases c1,c2,...]
        For each case NAME (default: all), a tiny random *ForCausalLM saved with save_pretrained into ROOT/NAME
        (config.json with `architectures`, model.safetensors), plus ROOT/NAME.ref.safetensors holding what HF
        computes with those files loaded back in fp32 (eager attention):
          tokens [3, 20] int64   prompts of lengths 20, 14, 7, left-padded with id 0; mask [3, 20] int64 (1 on
                                 tokens, 0 on padding)
          logits [3, 20, vocab] fp32   model(input_ids=tokens, attention_mask=mask, position_ids=cumsum(mask)-1
                                 clamped at 0): each sequence's own positions. Rows on padding are HF's garbage:
                                 compare where mask == 1.
          prompt [1, 6], greedy_one [1, 12]       the new tokens of generate(do_sample=False, 12 new tokens)
          batch [3, 9], batch_mask [3, 9], greedy_batch [3, 12]   the same for prompts of lengths 9, 5, 2,
                                 left-padded with 0
        Every case: vocab 301, hidden 64, intermediate 96, 2 layers, 4 query heads, 2 key/value heads,
        rms_norm_eps 1e-5, rope_theta 10000, max_position_embeddings 64 unless the case says otherwise, pad id 0, no
        bos/eos. Weights are redrawn from a generator seeded by crc32(NAME) + k: norm weights 1 + 0.1*randn, every
        other weight and bias 0.2*randn, then cast to the case's dtype; k is the first that keeps every greedy step
        clear of near-ties (top-1 minus top-2 logit >= MIN_GAP), so the tokens do not hinge on rounding. One line
        per case: k, max |logit|, for RoPE and sliding-window cases the largest change of the logits (at mask == 1)
        with the feature turned off on the same weights (asserted > 0.01: it must matter on these sequences), and
        the smallest top-1/top-2 gap. About 10 s for all cases on one core.
    python hf_family_oracle.py check DIR REF [DIR REF ...]
        For each pair, loads DIR with AutoModelForCausalLM (fp32, eager) and checks its logits on REF's tokens and mask against
        REF's logits (<= 1e-5 relative to the largest |logit|, at every position). Prints `hf_check max_rel=...`;
        exit 1 if off.
    python hf_family_oracle.py list
        The case names, one per line.

Notes on transformers 5.x that the C++ side has to match:
  * RoPE settings are the config's `rope_parameters` dict (rope_type, rope_theta, ...), saved as such in
    config.json.
  * dynamic (NTK): per call, seq_len = max(position_ids) + 1; HF recomputes inv_freq for seq_len when it exceeds
    the largest seen so far (at first max_position_embeddings) and goes back to the original frequencies when a
    call has seq_len < max_position_embeddings (state kept in the module: the refs use a fresh load per run). The
    KV cache keeps keys rotated with the frequencies of the step that wrote them.
  * longrope: short_factor while max(position_ids)+1 <= original_max_position_embeddings, long_factor once past it
    (for the whole call; cached keys keep their old rotation). With no `factor`, factor = max_position_embeddings /
    original_max_position_embeddings and attention_factor = sqrt(1 + ln(factor) / ln(original)).
  * sliding window W: query i attends to keys j with i - W < j <= i (W keys, itself included), counted in cache
    slots. Qwen2/Qwen3 apply it only on layers whose config.layer_types[i] == "sliding_attention" (layers
    i >= max_window_layers when use_sliding_window); Mistral on every layer.
"""
import argparse
import copy
import os
import sys
import time
import zlib

L = 20
NEW_TOKENS = 12
VOCAB = 301
MIN_GAP = 0.02  # top-1 minus top-2 logit at every greedy step: ~3e-3 of max |logit|, far above fp32 noise
MAX_TRIES = 50
ROPE_DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=64, rope_parameters=ROPE_DEFAULT,
            tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=None,
            attn_implementation="eager")

# name: (family, config overrides, saved dtype, overrides that turn the tested feature off or None)
CASES = {
    "llama": ("llama", {}, "float32", None),
    "llama_tied": ("llama", dict(tie_word_embeddings=True), "float32", None),
    "llama_bias": ("llama", dict(attention_bias=True, mlp_bias=True), "float32", None),
    "llama_head_dim": ("llama", dict(head_dim=24), "float32", None),
    "llama_kv1": ("llama", dict(num_key_value_heads=1), "float32", None),
    "llama_bf16": ("llama", {}, "bfloat16", None),
    "rope_llama3": ("llama", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}), "float32", dict(rope_parameters=ROPE_DEFAULT)),
    "rope_linear": ("llama", dict(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
                    "float32", dict(rope_parameters=ROPE_DEFAULT)),
    "rope_dynamic": ("llama", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
                                   max_position_embeddings=12), "float32", dict(rope_parameters=ROPE_DEFAULT)),
    "rope_yarn": ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 16}),
                  "float32", dict(rope_parameters=ROPE_DEFAULT)),
    "rope_longrope": ("llama", dict(rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0,
        "short_factor": [round(1.0 + 0.1 * i, 1) for i in range(8)],  # 8 = head_dim / 2
        "long_factor": [2.0 + 0.5 * i for i in range(8)],
        "original_max_position_embeddings": 16}), "float32", dict(rope_parameters=ROPE_DEFAULT)),
    "mistral": ("mistral", dict(sliding_window=5), "float32", dict(sliding_window=None)),
    "qwen2": ("qwen2", {}, "float32", None),
    "qwen2_sliding": ("qwen2", dict(use_sliding_window=True, sliding_window=5, max_window_layers=1), "float32",
                      dict(use_sliding_window=False)),
    "qwen3": ("qwen3", dict(head_dim=24, attention_bias=True), "float32", None),
}


def family_classes(family):
    import transformers
    prefix = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3"}[family]
    return getattr(transformers, prefix + "Config"), getattr(transformers, prefix + "ForCausalLM")


def make_config(name, off=False):
    family, overrides, _, off_overrides = CASES[name]
    config_class, _ = family_classes(family)
    kwargs = {**BASE, **overrides, **(off_overrides if off else {})}
    config = config_class(**copy.deepcopy(kwargs))  # the config standardizes rope_parameters in place
    if name == "qwen2_sliding" and not off:
        assert config.layer_types == ["full_attention", "sliding_attention"], config.layer_types
    return config


def load(path):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def logits_of(model, tokens, mask):
    import torch
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # HF's forward does not derive positions from the mask
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=mask, position_ids=position_ids).logits.float()


def greedy(model, ids, mask):
    """The new tokens of greedy generate, and the smallest top-1 minus top-2 logit over all steps and rows."""
    import torch
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None,
                             return_dict_in_generate=True, output_logits=True)
    top2 = torch.stack(out.logits).float().topk(2, dim=-1).values
    return out.sequences[:, ids.shape[1]:].contiguous(), (top2[..., 0] - top2[..., 1]).min().item()


def left_padded(lengths, g):
    import torch
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.int64)
    mask = torch.zeros(len(lengths), width, dtype=torch.int64)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(1, VOCAB, (n,), generator=g)
        mask[row, width - n:] = 1
    return ids, mask


def make_case(root, name):
    """Writes ROOT/NAME and ROOT/NAME.ref.safetensors; returns the sanity line. The weights come from seed
    crc32(NAME) + k for the first k whose greedy runs have every top-1/top-2 logit gap >= MIN_GAP."""
    for k in range(MAX_TRIES):
        line, gap = make_case_seeded(root, name, zlib.crc32(name.encode()) + k)
        if gap >= MIN_GAP:
            return line
    raise RuntimeError(f"{name}: no seed in {MAX_TRIES} tries gives top-2 gaps >= {MIN_GAP}")


def make_case_seeded(root, name, seed):
    import json
    import torch
    from safetensors.torch import save_file
    family, _, dtype, off_overrides = CASES[name]
    _, model_class = family_classes(family)
    torch.manual_seed(seed)
    model = model_class(make_config(name)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # larger than HF's 0.02 init, so the logits are well separated
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1.0 + 0.1 * noise if "norm" in pname else 0.2 * noise)
    model = model.to(getattr(torch, dtype))
    path = os.path.join(root, name)
    model.save_pretrained(path)

    with open(os.path.join(path, "config.json")) as f:
        saved = json.load(f)
    assert saved.get("architectures") == [model_class.__name__], saved.get("architectures")

    g = torch.Generator().manual_seed(seed + 1)
    tokens, mask = left_padded([L, L - 6, L - 13], g)
    prompt = torch.randint(1, VOCAB, (1, 6), generator=g)
    batch, batch_mask = left_padded([9, 5, 2], g)

    # A fresh load for every computation: dynamic and longrope RoPE keep state (inv_freq) between calls.
    loaded = load(path)
    for key in ("rope_parameters", "sliding_window", "layer_types", "head_dim", "num_key_value_heads",
                "tie_word_embeddings", "attention_bias", "mlp_bias", "max_position_embeddings"):
        assert getattr(loaded.config, key, None) == getattr(model.config, key, None), key
    logits = logits_of(loaded, tokens, mask)
    greedy_one, gap_one = greedy(load(path), prompt, torch.ones_like(prompt))
    greedy_batch, gap_batch = greedy(load(path), batch, batch_mask)
    save_file({"tokens": tokens, "mask": mask, "logits": logits.contiguous(), "prompt": prompt,
               "greedy_one": greedy_one, "batch": batch, "batch_mask": batch_mask, "greedy_batch": greedy_batch},
              os.path.join(root, name + ".ref.safetensors"))

    gap = min(gap_one, gap_batch)
    line = f"{name:<15} seed=crc32+{seed - zlib.crc32(name.encode())} " \
           f"max|logit|={logits[mask.bool()].abs().max().item():6.3f}"
    if off_overrides is not None:  # the same weights with the feature turned off
        plain = model_class(make_config(name, off=True)).eval()
        plain.load_state_dict(load(path).state_dict())
        diff = (logits_of(plain, tokens, mask) - logits)[mask.bool()].abs().max().item()
        line += f"  feature_off_diff={diff:6.3f}"
        assert diff > 1e-2, f"{name}: the feature does not change the logits on the test sequences"
    line += f"  min_top2_gap={gap:.4f}"
    return line, gap


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["make", "check", "list"])
    p.add_argument("paths", nargs="*", help="make: ROOT; check: DIR REF [DIR REF ...]")
    p.add_argument("--cases", default=None, help="comma list (make); default: all")
    a = p.parse_args()

    if a.mode == "list":
        print("\n".join(CASES))
        return 0
    if (a.mode == "make" and len(a.paths) != 1) or (a.mode == "check" and (not a.paths or len(a.paths) % 2)):
        p.error(f"{a.mode} needs {'ROOT' if a.mode == 'make' else 'DIR REF [DIR REF ...]'}")

    import torch
    import transformers
    from safetensors.torch import load_file
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()

    if a.mode == "make":
        names = a.cases.split(",") if a.cases else list(CASES)
        unknown = [n for n in names if n not in CASES]
        if unknown:
            p.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
        os.makedirs(a.paths[0], exist_ok=True)
        t0 = time.perf_counter()
        for name in names:
            print(make_case(a.paths[0], name), flush=True)
        print(f"made {len(names)} cases ({time.perf_counter() - t0:.1f} s)")
        return 0

    worst = 0.0
    for d, r in zip(a.paths[0::2], a.paths[1::2]):
        ref = load_file(r)
        got = logits_of(load(d), ref["tokens"], ref["mask"])
        max_rel = ((got - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
        print(f"hf_check {d} max_rel={max_rel:.3e}")
        worst = max(worst, max_rel)
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
