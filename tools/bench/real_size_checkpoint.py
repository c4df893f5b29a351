"""Random checkpoints of real model shapes, written as transformers publishes them: bf16 safetensors shards of at
most --max-shard-gb (5 GB, save_pretrained's default before transformers 5), model.safetensors.index.json when there
is more than one shard, config.json from transformers' own LlamaConfig (llama3 rope, tied embeddings where the real
model ties them, vocab 128,256), and generation_config.json. The real-size benchmarks (issue 47) read them.

    .venv/bin/python tools/bench/real_size_checkpoint.py DIR --shape llama3.2-1b|llama3.2-3b|llama3.1-8b|tiny
        [--dtype bfloat16|float16|float32] [--seed 0] [--max-shard-gb 5]

The model is never built: each tensor is drawn (N(0, 0.02), norms 1), written into the current shard and dropped, so
the writer's memory is one tensor, whatever the shape. The same seed gives the same files. Ends with a `summary` line.
"""
import argparse
import json
import os
import sys
import time

# The published config.json fields of Meta's checkpoints (hidden sizes, heads, rope), as LlamaConfig kwargs.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
SHAPES = {
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=64, tie_word_embeddings=True, rope_theta=500000.0,
                        rope_scaling=LLAMA3_ROPE),
    "llama3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                        num_key_value_heads=8, head_dim=128, tie_word_embeddings=True, rope_theta=500000.0,
                        rope_scaling=LLAMA3_ROPE),
    "llama3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                        num_key_value_heads=8, head_dim=128, tie_word_embeddings=False, rope_theta=500000.0,
                        rope_scaling=dict(LLAMA3_ROPE, factor=8.0)),
    # The same layout at a size the tests can afford.
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=500000.0,
                 rope_scaling=LLAMA3_ROPE),
}
COMMON = dict(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=128000,
              eos_token_id=128001, hidden_act="silu", attention_bias=False, mlp_bias=False)


def tensor_shapes(c):
    """(name, shape) of every tensor, in the order transformers' state_dict lists them."""
    h, i, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    out = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i)), (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,))]
    out.append(("model.norm.weight", (h,)))
    if not c["tie_word_embeddings"]:
        out.append(("lm_head.weight", (c["vocab_size"], h)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-gb", type=float, default=5.0)
    a = ap.parse_args()

    import torch
    import transformers
    from safetensors.torch import save_file

    dtype = getattr(torch, a.dtype)
    fields = dict(COMMON, **SHAPES[a.shape])
    config = transformers.LlamaConfig(**fields)
    config.torch_dtype = dtype  # (saved as "dtype" by transformers 5, "torch_dtype" before)
    os.makedirs(a.dir, exist_ok=True)
    config.save_pretrained(a.dir)
    transformers.GenerationConfig(bos_token_id=fields["bos_token_id"], eos_token_id=fields["eos_token_id"]).save_pretrained(a.dir)

    shapes = tensor_shapes(fields)
    itemsize = torch.empty((), dtype=dtype).element_size()
    limit = int(a.max_shard_gb * 1e9)
    # Shards as save_pretrained cuts them: tensors in order, a new shard when the next one would pass the limit.
    shards, current, size = [], [], 0
    for name, shape in shapes:
        n = itemsize * int(torch.Size(shape).numel())
        if current and size + n > limit:
            shards.append(current)
            current, size = [], 0
        current.append((name, shape))
        size += n
    shards.append(current)

    g = torch.Generator().manual_seed(a.seed)
    t0 = time.perf_counter()
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, shape in shard:
            if name.endswith("norm.weight"):
                t = torch.ones(shape, dtype=dtype)
            else:
                t = (torch.randn(shape, generator=g) * 0.02).to(dtype)
            tensors[name] = t
            weight_map[name] = file
            total += t.numel() * itemsize
        save_file(tensors, os.path.join(a.dir, file), metadata={"format": "pt"})
        del tensors
        print(f"progress shard {k + 1}/{len(shards)} {file}", flush=True)
    if len(shards) > 1:
        with open(os.path.join(a.dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    params = sum(int(torch.Size(s).numel()) for _, s in shapes)
    print(f"summary shape={a.shape} dtype={a.dtype} params={params} bytes={total} shards={len(shards)} "
          f"seconds={time.perf_counter() - t0:.1f} dir={a.dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
