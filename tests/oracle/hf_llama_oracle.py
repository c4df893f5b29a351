"""Hugging Face transformers on the other side of llama::load_hf_llama / save_hf_llama (tests/models/test_llama_hf.cpp).

    python hf_llama_oracle.py make DIR REF [--tied] [--dtype float32|bfloat16] [--max-shard-size 40KB]
        A tiny random LlamaForCausalLM (GQA: 4 query heads, 2 key/value heads; 2 layers), saved with
        save_pretrained into DIR (sharded with an index when --max-shard-size is given), plus REF (a safetensors
        file): a fixed batch of tokens and HF's fp32 logits for it (the saved files loaded back in fp32).
        --quantize int8: the files in --dtype, loaded back in it and quantized by torchao's
        quantize_(model, Int8WeightOnlyConfig()); REF's logits are that model's (as fp32), and REF holds every
        Linear's int8 values and scales as "q.<name>", "s.<name>" (torchao's Int8Tensor qdata, scale), and the
        unquantized model's logits in --dtype ("unquantized_logits"). --quantize int4-32: the same with
        PrototypeInt4WeightOnlyConfig(group_size=32) (torchao's CPU int4), "q.<name>" the 4-bit values [N, K] as
        uint8, "s.<name>", "z.<name>" the groups' scales and zeros (fp32).
    python hf_llama_oracle.py check DIR REF
        Loads DIR with LlamaForCausalLM.from_pretrained and checks its logits on REF's tokens against REF's
        logits (<= 1e-5 relative to the largest |logit|). Prints `hf_check max_rel=...`; exit 1 if off.
"""
import argparse
import sys


def logits_of(model, tokens):
    import torch
    with torch.no_grad():
        return model(input_ids=tokens).logits.float()


def main():
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["make", "check"])
    p.add_argument("dir")
    p.add_argument("ref", nargs="?")
    p.add_argument("--tied", action="store_true")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-shard-size", default=None)
    p.add_argument("--intermediate-size", type=int, default=96)
    p.add_argument("--quantize", choices=["int8", "int4-32"], default=None)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    if a.mode == "make":
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=a.intermediate_size, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=a.tied,
                             attn_implementation="eager")
        model = LlamaForCausalLM(config).eval()
        with torch.no_grad():  # larger than HF's 0.02 init, so the logits are not all near zero
            for name, w in model.named_parameters():
                if "norm" in name:
                    w.copy_(1.0 + 0.1 * torch.randn_like(w))
                else:
                    w.copy_(0.2 * torch.randn_like(w))
        dtype = getattr(torch, a.dtype)
        model = model.to(dtype)
        kwargs = {"max_shard_size": a.max_shard_size} if a.max_shard_size else {}
        model.save_pretrained(a.dir, **kwargs)
        tokens = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
        if a.quantize:
            from torchao.quantization import Int8WeightOnlyConfig, quantize_
            loaded = LlamaForCausalLM.from_pretrained(a.dir, dtype=dtype, attn_implementation="eager").eval()
            # Also the unquantized model's logits in the same dtype: how far that dtype's own rounding moves them.
            out = {"tokens": tokens, "unquantized_logits": logits_of(loaded, tokens).contiguous()}
            if a.quantize == "int8":
                quantize_(loaded, Int8WeightOnlyConfig())
            else:
                # torchao's CPU int4 weight-only (Int4OpaqueTensor: LibTorch's _weight_int4pack_mm_for_cpu, whose
                # packing is opaque): the values, scales and zeros come from the same tinygemm primitives it calls.
                from torchao.prototype.quantization.int4.inference_workflow import PrototypeInt4WeightOnlyConfig
                from torchao.quantization.quant_primitives import (MappingType, _choose_qparams_affine_tinygemm,
                                                                   _quantize_affine_tinygemm)
                group = int(a.quantize.split("-")[1])
                for name, module in loaded.named_modules():
                    if isinstance(module, torch.nn.Linear):
                        w = module.weight.detach()
                        s, z = _choose_qparams_affine_tinygemm(w, MappingType.ASYMMETRIC, [1, group], torch.int32, 0,
                                                               15, 1e-6, None, w.dtype)
                        q = _quantize_affine_tinygemm(w, [1, group], s, z, torch.int32, 0, 15)
                        out["q." + name] = q.to(torch.uint8).contiguous()
                        out["s." + name] = s.reshape(w.shape[0], -1).float().contiguous()
                        out["z." + name] = z.reshape(w.shape[0], -1).float().contiguous()
                quantize_(loaded, PrototypeInt4WeightOnlyConfig(group_size=group))
            out["logits"] = logits_of(loaded, tokens).contiguous()
            for name, module in loaded.named_modules():
                if isinstance(module, torch.nn.Linear) and a.quantize == "int8":
                    out["q." + name] = module.weight.qdata.contiguous()
                    out["s." + name] = module.weight.scale.reshape(-1).float().contiguous()
            save_file(out, a.ref)
            return 0
        # HF's logits as a user gets them: the saved files loaded back in fp32 (model.to(bf16).float() would
        # also round HF's rotary inv_freq buffer, which the files do not hold).
        loaded = LlamaForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager").eval()
        save_file({"tokens": tokens, "logits": logits_of(loaded, tokens).contiguous()}, a.ref)
        return 0

    ref = load_file(a.ref)
    model = LlamaForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager").eval()
    got = logits_of(model, ref["tokens"])
    max_rel = ((got - ref["logits"]).abs().max() / ref["logits"].abs().max()).item()
    print(f"hf_check max_rel={max_rel:.3e}")
    return 0 if max_rel <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
