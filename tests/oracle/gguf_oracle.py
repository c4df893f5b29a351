"""ggml's `gguf` package and transformers' GGUF loading on the other side of dtensor::checkpoint::GgufFile and
llama::load_gguf_llama (tests/checkpoint/test_gguf.cpp, tests/models/test_llama_gguf.cpp).

    python gguf_oracle.py blocks OUT
        OUT (safetensors): for each block type we read, "raw.<TYPE>" (uint8 [rows, bytes]: random blocks whose fp16
        scales are finite) and "deq.<TYPE>" (fp32 [rows, values]: gguf.quants.dequantize of them).
    python gguf_oracle.py make DIR FILE REF --mix MIX [--llama3-rope]
        A tiny random LlamaForCausalLM (GQA: 4 query heads of 64, 2 key/value heads; 2 layers; rows of 256 and 512,
        whole K-quant blocks) saved to DIR by save_pretrained in fp32, and written to FILE as llama.cpp's
        convert_hf_to_gguf writes it (its tensor names, attn_q / attn_k rows permuted to ggml's rotary order, the
        1-D norms in F32, metadata llama.*). MIX is the matrices' type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0
        (quantized from the model's weights by gguf.quants), or Q4_K_M / Q5_K_M (llama-quantize's mixes: Q4_K or
        Q5_K, with Q6_K for attn_v, ffn_down and output; gguf.quants cannot quantize K-quants, so these matrices are
        random blocks, and the HF model is not theirs). With --llama3-rope the model has Llama 3's rope scaling and
        FILE its rope_freqs tensor, computed as convert_hf_to_gguf computes it.
        --tokenizer: FILE carries a byte-level BPE vocabulary (trained here, Llama 3's split); REF then holds
        "text.<i>" (UTF-8 bytes) and "ids.<i>" / "plain_ids.<i>" (transformers' AutoTokenizer.from_pretrained(dir,
        gguf_file=FILE) with and without special tokens; [-1] stands for none).
        --arch NAME, --extra-kv KEY=N, --no-oracle: a file with another architecture or one more metadata value,
        and no REF (the files the loader must refuse).
        REF (safetensors): "tokens", "gguf_logits" (LlamaForCausalLM.from_pretrained(dir, gguf_file=FILE) in fp32:
        transformers dequantizing FILE), "hf_logits" (DIR's model in fp32) and "greedy" (the 8
        tokens transformers' greedy generate appends to the first row of tokens, from FILE's model).
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench"))
from hf_to_gguf import add_llama_metadata, add_matrix, gguf_name, tensor_data  # noqa: E402  (convert_hf_to_gguf's way)

K_MIX = {"Q4_K_M": ("Q4_K", "Q6_K"), "Q5_K_M": ("Q5_K", "Q6_K")}
SCALE_OFFSETS = {"Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def random_blocks(qtype, rows, values, rng, scale=1.0):
    """uint8 [rows, bytes] of random blocks of `qtype` whose fp16 fields are finite (|d| <= scale)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    t = GGMLQuantizationType[qtype]
    block, nbytes = GGML_QUANT_SIZES[t]
    n = rows * values // block
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        d = (rng.uniform(-1, 1, size=n) * scale).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n, 2)
    return raw.reshape(rows, values // block * nbytes)


def blocks(out):
    import torch
    from gguf import GGMLQuantizationType, quants
    from safetensors.torch import save_file
    rng = np.random.default_rng(0)
    tensors = {}
    for qtype in SCALE_OFFSETS:
        raw = random_blocks(qtype, 3, 512, rng)
        deq = quants.dequantize(raw, GGMLQuantizationType[qtype]).astype(np.float32)
        tensors["raw." + qtype] = torch.from_numpy(raw.copy())
        tensors["deq." + qtype] = torch.from_numpy(deq.copy())
    save_file(tensors, out)


LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEXTS = ["Hello world", "  two  spaces, and\nnew lines\n\n", "numbers 1234567 and caf\u00e9 \u2603 emoji \U0001F600",
         "<|begin_of_text|>special in text<|end_of_text|>", "Everyone is permitted to copy and distribute verbatim copies",
         "", "'s 're 'LL shouting CAPS"]


def train_tokenizer(vocab_size):
    """A byte-level BPE as Llama 3's (its split regex, then bytes), trained on the GPL's text; two control tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    text = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()
    tok.train_from_iterator([text], trainer)
    return tok


def add_tokenizer(w, tok):
    """The vocabulary as convert_hf_to_gguf writes a byte-level BPE (tokenizer.ggml.*, pre 'llama-bpe')."""
    import json
    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    specials = {"<|begin_of_text|>", "<|end_of_text|>"}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in model["merges"]])
    w.add_bos_token_id(vocab["<|begin_of_text|>"])
    w.add_eos_token_id(vocab["<|end_of_text|>"])
    w.add_add_bos_token(True)


def make(a):
    import torch
    import gguf
    from gguf import GGMLQuantizationType
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    rope = None
    if a.llama3_rope:
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16}
    heads, kv_heads, hidden, base = 4, 2, 256, 10000.0
    tok = train_tokenizer(320) if a.tokenizer else None
    config = LlamaConfig(vocab_size=tok.get_vocab_size() if tok else 128, hidden_size=hidden, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_theta=base, rope_scaling=rope, tie_word_embeddings=False,
                         attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger than HF's init, so the logits are not all near zero
        for name, w in model.named_parameters():
            if "norm" in name:
                w.copy_(1.0 + 0.1 * torch.randn_like(w))
            else:
                w.copy_(0.1 * torch.randn_like(w))
    model.save_pretrained(a.dir)

    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(a.file, a.arch)
    add_llama_metadata(w, model.config.to_dict())
    for kv in a.extra_kv:
        key, value = kv.split("=")
        w.add_uint32(key, int(value))
    if tok:
        add_tokenizer(w, tok)
    for name, p in model.named_parameters():
        gname = gguf_name(name)
        data = tensor_data(gname, p.detach().float().numpy(), model.config.to_dict())
        if data.ndim > 1 and a.mix in K_MIX:
            base, high = K_MIX[a.mix]
            qtype = high if any(k in gname for k in ("attn_v", "ffn_down", "output.")) else base
            raw = random_blocks(qtype, data.shape[0], data.shape[1], rng, scale=0.004)
            w.add_tensor(gname, raw, raw_shape=raw.shape, raw_dtype=GGMLQuantizationType[qtype])
        else:
            add_matrix(w, gname, data, a.mix)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    tokens = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    if a.no_oracle:
        return 0
    with torch.no_grad():
        hf = LlamaForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager").eval()
        hf_logits = hf(input_ids=tokens).logits.float()
        g = LlamaForCausalLM.from_pretrained(os.path.dirname(a.file) or ".", gguf_file=os.path.basename(a.file),
                                             dtype=torch.float32, attn_implementation="eager").eval()
        gguf_logits = g(input_ids=tokens).logits.float()
        g.generation_config.pad_token_id = g.generation_config.eos_token_id = None
        greedy = g.generate(tokens[:1], max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, tokens.shape[1]:]
    out = {"tokens": tokens, "hf_logits": hf_logits.contiguous(), "gguf_logits": gguf_logits.contiguous(),
           "greedy": greedy.contiguous()}
    if tok:
        from transformers import AutoTokenizer
        hf_tok = AutoTokenizer.from_pretrained(os.path.dirname(a.file) or ".", gguf_file=os.path.basename(a.file))
        for i, text in enumerate(TEXTS):
            out[f"text.{i}"] = torch.tensor(list(text.encode("utf-8")) or [0], dtype=torch.uint8)[: len(text.encode())]
            out[f"ids.{i}"] = torch.tensor(hf_tok(text)["input_ids"] or [-1], dtype=torch.long)
            out[f"plain_ids.{i}"] = torch.tensor(hf_tok(text, add_special_tokens=False)["input_ids"] or [-1],
                                                 dtype=torch.long)
    save_file(out, a.ref)
    rel = ((gguf_logits - hf_logits).abs().max() / hf_logits.abs().max()).item()
    print(f"gguf_oracle mix={a.mix} llama3_rope={bool(rope)}: transformers' GGUF load vs the HF model: max_rel={rel:.3e}")
    return 0


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    b = sub.add_parser("blocks")
    b.add_argument("out")
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("file")
    m.add_argument("ref")
    m.add_argument("--mix", required=True, choices=["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", *K_MIX])
    m.add_argument("--llama3-rope", action="store_true")
    m.add_argument("--tokenizer", action="store_true", help="a byte-level BPE vocabulary in FILE (vocab 320)")
    m.add_argument("--arch", default="llama", help="general.architecture (and the metadata keys' prefix)")
    m.add_argument("--extra-kv", action="append", default=[], help="KEY=N: one more u32 metadata value")
    m.add_argument("--no-oracle", action="store_true", help="write DIR and FILE only (files the loader refuses)")
    a = p.parse_args()
    if a.mode == "blocks":
        blocks(a.out)
        return 0
    return make(a)


if __name__ == "__main__":
    sys.exit(main())
