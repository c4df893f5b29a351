"""A transformers Llama checkpoint as a GGUF file, as llama.cpp's convert_hf_to_gguf writes one (its LlamaModel: tensor
names, attn_q / attn_k rows permuted to ggml's rotary order, Llama 3's rope scaling as a rope_freqs tensor, 1-D norms in
F32, llama.* metadata), the matrices in one type quantized by ggml's `gguf` package. No vocabulary (llama.cpp's
no_vocab): generate from token ids, or give --tokenizer DIR.

    python tools/bench/hf_to_gguf.py DIR OUT.gguf --type Q8_0|Q4_0|Q4_1|Q5_0|BF16|F16|F32

The quantized tensors are held until the file is written (its size in memory; the safetensors files are mapped). tests/oracle/gguf_oracle.py writes its files with
the same functions. Prints `summary tensors=.. bytes=.. seconds=..`.
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np

LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
               "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
TOP_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}


def gguf_name(hf_name):
    """convert_hf_to_gguf's name of an HF Llama tensor."""
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    parts = hf_name.split(".")  # model.layers.N.<module...>.weight|bias
    return f"blk.{parts[2]}.{LAYER_NAMES['.'.join(parts[3:-1])]}.{parts[-1]}"


def permute(w, n_head):
    """convert_hf_to_gguf's LlamaModel.permute: HF's rotate-half rows to ggml's pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_freqs(rope, head_dim, base):
    """convert_hf_to_gguf's LlamaModel.generate_extra_tensors: Llama 3's scaling as per-dim factors."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def add_llama_metadata(w, c):
    """The llama.* keys from a config.json dict (transformers >= 5 keeps rope_theta under rope_parameters)."""
    heads = c["num_attention_heads"]
    head_dim = c.get("head_dim") or c["hidden_size"] // heads
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    base = c.get("rope_theta", rope.get("rope_theta", 10000.0))
    w.add_block_count(c["num_hidden_layers"])
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(c.get("num_key_value_heads") or heads)
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_rope_freq_base(base)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(c["vocab_size"])
    if head_dim != c["hidden_size"] // heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if rope.get("rope_type", rope.get("type")) == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_freqs(rope, head_dim, base))


def tensor_data(name, data, config):
    """The tensor as the file stores it: q / k rows permuted."""
    heads = config["num_attention_heads"]
    if name.endswith("attn_q.weight") or name.endswith("attn_q.bias"):
        return permute(data, heads)
    if name.endswith("attn_k.weight") or name.endswith("attn_k.bias"):
        return permute(data, config.get("num_key_value_heads") or heads)
    return data


def add_matrix(w, name, data, qtype_name):
    """A tensor in `qtype_name` (1-D ones in F32, as convert_hf_to_gguf keeps norms)."""
    from gguf import GGMLQuantizationType, quants
    data = np.ascontiguousarray(data, dtype=np.float32)
    if data.ndim == 1 or qtype_name == "F32":
        w.add_tensor(name, data)
        return
    qtype = GGMLQuantizationType[qtype_name]
    raw = quants.quantize(data, qtype)
    w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("out")
    p.add_argument("--type", default="Q8_0", choices=["Q8_0", "Q4_0", "Q4_1", "Q5_0", "BF16", "F16", "F32"])
    a = p.parse_args()
    import gguf
    import torch
    from safetensors import safe_open
    start = time.time()
    config = json.load(open(os.path.join(a.dir, "config.json")))
    if config.get("model_type") not in ("llama", "mistral"):
        sys.exit(f"error: model_type {config.get('model_type')!r}: llama and mistral are converted")
    w = gguf.GGUFWriter(a.out, "llama")
    add_llama_metadata(w, config)
    files = sorted(glob.glob(os.path.join(a.dir, "*.safetensors")))
    count = 0
    for path in files:
        with safe_open(path, "pt") as f:
            for key in f.keys():
                name = gguf_name(key)
                data = tensor_data(name, f.get_tensor(key).to(torch.float32).numpy(), config)
                add_matrix(w, name, data, a.type)
                count += 1
                print(f"[{count}] {name} {a.type if data.ndim > 1 else 'F32'} {list(data.shape)}", flush=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"summary tensors={count} bytes={os.path.getsize(a.out)} seconds={time.time() - start:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
