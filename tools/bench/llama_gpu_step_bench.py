"""PyTorch's side of the Llama step benchmark: the same Llama-3-style model as llama_train (Hugging Face
transformers' LlamaForCausalLM, which our model matches weight for weight), AdamW with llama_train's settings,
clipping at 1, one process (TP 1), timed like llama_train (median step over the run after 3 warm-up steps;
the loss's .item() ends each step, as llama_train's does).

    .venv/bin/python tools/bench/llama_gpu_step_bench.py --device cuda --dim 512 --layers 4 ... --steps 30
Prints progress and a `summary` line with median_step_ms and tokens_per_s.
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    for name, default in [("dim", 256), ("layers", 4), ("heads", 8), ("kv-heads", 4), ("ffn-dim", 768),
                          ("vocab", 256), ("seq-len", 64), ("batch", 4), ("steps", 30)]:
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.dim, num_hidden_layers=a.layers,
                         num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, intermediate_size=a.ffn_dim,
                         rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         max_position_embeddings=max(2048, a.seq_len), attention_bias=False, mlp_bias=False)
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(a.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1)
    times = []
    for step in range(a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=gen)
        inputs, labels = tokens[:, :-1].to(a.device), tokens[:, 1:].to(a.device)
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(0, 1))
        loss.backward()
        value = loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
        if (step + 1) % 10 == 0:
            print(f"step {step + 1:5d}  loss {value:.6f}  {times[-1]:.1f} ms/step", flush=True)
    med = statistics.median(times[3:])
    print(f"summary impl=pytorch torch={torch.__version__} device={a.device} median_step_ms={med:.3f} "
          f"tokens_per_s={a.batch * a.seq_len / (med / 1e3):.1f}")


if __name__ == "__main__":
    main()
