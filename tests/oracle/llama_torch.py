"""The Llama of models/llama in PyTorch (HF's parameter names, rotate-half rotary, GQA via repeat_kv, SwiGLU)
and torchtitan's TP + SP plan through PyTorch's parallelize_module: one home for the oracle
(llama_oracle.py) and the benchmark twin (tools/bench/llama_step_bench.py).

cfg is models/llama's config as a dict (config_to_hf_json's keys). PyTorch runs attention through SDPA's
math kernel: its DTensor has no rule for the CPU flash kernel. cfg["sdpa_flash"] = True (plain tensors only: TP 1)
lets SDPA choose its kernel, for the benchmarks.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)
from torch.nn.attention import SDPBackend, sdpa_kernel


def build_llama(cfg):
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            h, nh, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
            self.q_proj = nn.Linear(h, nh * hd, bias=False)
            self.k_proj = nn.Linear(h, kv * hd, bias=False)
            self.v_proj = nn.Linear(h, kv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, h, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q = self.q_proj(x).view(b, s, -1, hd).transpose(1, 2)
            k = self.k_proj(x).view(b, s, -1, hd).transpose(1, 2)
            v = self.v_proj(x).view(b, s, -1, hd).transpose(1, 2)

            def rope(t):
                half = t.shape[-1] // 2
                return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin

            q, k = rope(q), rope(k)
            n_rep = q.shape[1] // k.shape[1]
            if n_rep > 1:
                k = k[:, :, None].expand(b, k.shape[1], n_rep, s, hd).reshape(b, -1, s, hd)
                v = v[:, :, None].expand(b, v.shape[1], n_rep, s, hd).reshape(b, -1, s, hd)
            # PyTorch's DTensor has no rule for the CPU flash kernel (aten._scaled_dot_product_flash_attention_for_cpu):
            # its math decomposition runs on the head shards (its causal mask is a plain tensor: implicit_replication).
            if cfg.get("sdpa_flash"):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                with sdpa_kernel(SDPBackend.MATH), implicit_replication():
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            h, f = cfg["hidden_size"], cfg["intermediate_size"]
            self.gate_proj = nn.Linear(h, f, bias=False)
            self.up_proj = nn.Linear(h, f, bias=False)
            self.down_proj = nn.Linear(f, h, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attention(), MLP()
            self.input_layernorm = nn.RMSNorm(cfg["hidden_size"], eps=cfg["rms_norm_eps"])
            self.post_attention_layernorm = nn.RMSNorm(cfg["hidden_size"], eps=cfg["rms_norm_eps"])

        def forward(self, x, cos, sin):
            h = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return h + self.mlp(self.post_attention_layernorm(h))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
            self.layers = nn.ModuleList(Layer() for _ in range(cfg["num_hidden_layers"]))
            self.norm = nn.RMSNorm(cfg["hidden_size"], eps=cfg["rms_norm_eps"])

        def forward(self, tokens):
            s = tokens.shape[1]
            inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
            freqs = torch.outer(torch.arange(s, dtype=torch.float32), inv_freq)
            angles = torch.cat((freqs, freqs), dim=-1)
            h = self.embed_tokens(tokens)
            # In the activations' dtype, as HF's rotary embedding returns them (bf16 under FSDP's mp_policy).
            cos, sin = angles.cos().to(h.dtype), angles.sin().to(h.dtype)
            for layer in self.layers:
                h = layer(h, cos, sin)
            return self.norm(h)

    class LlamaForCausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Body()
            self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)

        def forward(self, tokens):
            return self.lm_head(self.model(tokens))

    return LlamaForCausalLM()


def apply_torchtitan_tp(model, mesh, float8=False):
    """torchtitan's apply_tp (models/llama3/infra/parallelize.py), on HF's names. float8: its
    enable_float8_tensorwise_tp form, torchao's float8 styles (the Linear layers converted by torchao first); the
    attention's rotary tables pass through as plain tensors there (torchao's PrepareFloat8ModuleInput would cast every
    input with a layout), so q/k/v hand local heads to the attention."""
    if float8:
        from torchao.float8.float8_tensor_parallel import (Float8ColwiseParallel, Float8RowwiseParallel,
                                                           PrepareFloat8ModuleInput)
        colwise, rowwise, prepare = Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    else:
        colwise, rowwise, prepare = ColwiseParallel, RowwiseParallel, PrepareModuleInput
    parallelize_module(model, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
    })
    if float8:
        attention = {"self_attn": prepare(input_layouts=(Shard(1), None, None), desired_input_layouts=(Replicate(), None, None)),
                     "self_attn.q_proj": colwise(), "self_attn.k_proj": colwise(), "self_attn.v_proj": colwise()}
    else:
        attention = {"self_attn": PrepareModuleInput(input_layouts=(Shard(1), Replicate(), Replicate()),
                                                     desired_input_layouts=(Replicate(), Replicate(), Replicate())),
                     "self_attn.q_proj": ColwiseParallel(use_local_output=False),
                     "self_attn.k_proj": ColwiseParallel(use_local_output=False),
                     "self_attn.v_proj": ColwiseParallel(use_local_output=False)}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {
            "input_layernorm": SequenceParallel(),
            **attention,
            "self_attn.o_proj": rowwise(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": prepare(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": colwise(),
            "mlp.up_proj": colwise(),
            "mlp.down_proj": rowwise(output_layouts=Shard(1)),
        })
