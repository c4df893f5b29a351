"""Hugging Face transformers on the other side of the C++ tests that load tiny random checkpoints of several model
families (Llama and its RoPE scalings, Mistral, Qwen2, Qwen3, Gemma 1/2/3, Granite, StarCoder2, OLMo 1/2, Cohere
1/2, Phi-3, GLM) and compare logits and greedy tokens.

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
          logits_bf16, greedy_one_bf16, greedy_batch_bf16   the same, the files loaded in bfloat16
                                 (from_pretrained(dtype=torch.bfloat16)) with transformers' default attention,
                                 sdpa (eager where attn_logit_softcapping is set); logits_bf16 in fp32
          gaps_one_bf16 [1, 12], gaps_batch_bf16 [3, 12] fp32   each bf16 greedy step's top-1 minus top-2 logit
        Every case: vocab 301, hidden 64, intermediate 96, 2 layers, 4 query heads, 2 key/value heads,
        rms_norm_eps 1e-5, rope_theta 10000, max_position_embeddings 64 unless the case says otherwise, pad id 0, no
        bos/eos (GLM's config turns eos None into its ids [151329, 151336, 151338], all >= vocab: never generated).
        FAMILY_BASE adapts this per family: head_dim 16 given explicitly for gemma/gemma2/gemma3_text/glm (their
        class defaults are 256/128, not hidden / heads); the eps field is norm_epsilon (starcoder2),
        layer_norm_eps (cohere, cohere2) or absent (olmo: eps 1e-5 fixed in code); tie_word_embeddings True for
        gemma*, starcoder2, cohere* (their defaults); phi3 original_max_position_embeddings 64.
        Weights are redrawn from a generator seeded by crc32(NAME) + k: norm weights 1 + 0.1*randn (also for the
        Gemma norms, whose weight is an offset: they scale by 2 + 0.1*randn), norm biases (StarCoder2's LayerNorm)
        and every other weight and bias 0.2*randn, then cast to the case's dtype; k is the first that keeps every
        greedy step clear of near-ties (top-1 minus top-2 logit >= MIN_GAP), so the tokens do not hinge on
        rounding. One line per case: k, max |logit|, for cases with features that config can turn off the largest
        change of the logits (at mask == 1) with each feature turned off on the same weights, in the order of the
        case's off list (each asserted > 0.01: it must matter on these sequences), and the smallest top-1/top-2
        gap. About 15 s for all cases on one core.

        The cases of the other families (sizes as above unless said):
          gemma           GemmaRMSNorm (1 + w), embeddings * sqrt(hidden), gelu_pytorch_tanh MLP, tied
          gemma2          + sandwich norms (pre/post attention and feed-forward), query_pre_attn_scalar 24 (scale
                          24^-0.5, head_dim 16), attn_logit_softcapping 2, final_logit_softcapping 5, sliding_window 5
                          on layer 0 (layer_types sliding, full). Off: all full; no attention softcap; no final
                          softcap; query_pre_attn_scalar 16
          gemma3          gemma3_text: Gemma 2 without softcaps + q_norm/k_norm ((1 + w) RMSNorm over head_dim,
                          before RoPE), query_pre_attn_scalar 24, sliding_window 5 on layer 0, RoPE per layer type:
                          full layers linear factor 2, theta 1e6; sliding layers default, theta 1e4 (the old
                          rope_local_base_freq). Off: all full; sliding layers with the full layers' RoPE; full
                          layers with the sliding layers' RoPE; query_pre_attn_scalar 16
          granite         embedding_multiplier 2, attention_multiplier 0.15 (the softmax scale, replacing
                          head_dim^-0.5), residual_multiplier 0.5, logits_scaling 0.5 (logits / 0.5). Off: each 1
                          (attention_multiplier 0.25 = 16^-0.5)
          starcoder2      LayerNorm with bias (norm_epsilon), biases on q/k/v/o and c_fc/c_proj (use_bias), gelu
                          MLP without gate, sliding_window 5 on every layer, tied. Off: no sliding window
          olmo            non-parametric LayerNorm (eps 1e-5), clip_qkv 1.5 (q, k, v clamped after projection).
                          Off: no clip
          olmo2           post-norms only (no input_layernorm), q_norm/k_norm RMSNorm over the full q/k width
                          (before the head split), 4 key/value heads (sharded at TP 4, never replicated), no off
          cohere          LayerNorm without bias (mean subtracted, layer_norm_eps), parallel attention + MLP from one
                          norm, interleaved RoPE, logit_scale 2, tied. Off: logit_scale 1
          cohere_qk_norm  cohere + use_qk_norm: per-head LayerNorm weights [heads, head_dim] on q and k before
                          RoPE. Off: use_qk_norm False
          cohere2         Cohere's layer without qk norm, sliding_window 5 on layer 0 with RoPE, layer 1 full
                          attention without RoPE, logit_scale 2. Off: both layers sliding (with RoPE);
                          sliding_window 4096
          phi3            packed qkv_proj and gate_up_proj, sliding_window 5 on every layer. Off: no sliding window
          phi3_longrope   partial_rotary_factor 0.75 (rotary dim 12 of 16), longrope (6 short/long factors),
                          original_max_position_embeddings 16, max_position_embeddings 64; its greedy runs cross 16
                          tokens (Phi-3's cache reset, below). Off: default RoPE on 12 dims; default RoPE on all 16
          gemma2_bf16     gemma2 (window 5, both soft-caps) saved in bfloat16. No off
          phi3_bf16       phi3 saved in bfloat16 (the packed weights are cut after the dtype cast). No off
          glm             packed gate_up_proj, q/k/v biases (o_proj none), partial_rotary_factor 0.5 with GLM's
                          interleaved rotation of the first 8 dims. Off: partial_rotary_factor 1
          mixtral         mixture of experts on every layer: 4 experts (intermediate 48), top 2, renormalised;
                          sliding_window 5. Off: no sliding window
          qwen2_moe       4 experts (moe_intermediate 24), top 2, norm_topk_prob False, + shared expert
                          (intermediate 40) scaled by sigmoid(shared_expert_gate); mlp_only_layers [1]: layer 1 is a
                          dense MLP (intermediate 64). Off: norm_topk_prob True
          qwen3_moe       4 experts (moe_intermediate 24), top 2, norm_topk_prob True, q/k norms, head_dim 12.
                          Off: norm_topk_prob False
        The MoE cases load with experts_implementation="eager" (HF's per-expert loop; the default grouped_mm agrees
        in fp32), their seeds also keep every router clear of near-ties (on every real token of tokens, prompt and
        batch, in every sparse layer, the k-th minus (k+1)-th largest router probability >= MIN_ROUTE_GAP), and their
        refs add, from one forward on tokens (attention_mask=mask, the positions above, output_router_logits=True,
        labels = tokens where mask == 1 else -100):
          aux_loss [] fp32        the load-balancing loss (padding masked out)
          router_logits [n_sparse, 3 * 20, experts] fp32   each sparse layer's router logits, rows = flattened [B, S]
          loss [] fp32            cross-entropy + router_aux_loss_coef * aux_loss
        On disk (save_pretrained's original format) the experts are per-expert 2-D weights: Mixtral
        block_sparse_moe.gate / experts.E.w1 (gate), w3 (up), w2 (down); Qwen mlp.gate / experts.E.{gate,up,down}_proj
        (Qwen2-MoE + mlp.shared_expert.* and mlp.shared_expert_gate).
    python hf_family_oracle.py check DIR REF [DIR REF ...]
        For each pair, loads DIR with AutoModelForCausalLM (fp32, eager) and checks its logits on REF's tokens and
        mask against REF's logits (<= 1e-5 relative to the largest |logit|, at every position). Prints
        `hf_check max_rel=...`; exit 1 if off.
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
    i >= max_window_layers when use_sliding_window); Mistral, StarCoder2 and Phi-3 on every layer (when
    sliding_window is not null); Gemma 2/3 and Cohere 2 on layers with layer_types[i] == "sliding_attention" (their
    configs default layer_types from an every-2nd / every-6th / every-4th-is-full pattern).
  * Gemma: the embedding scale is a buffer torch.tensor(hidden_size ** 0.5) cast to the weights' dtype before the
    multiply; RMSNorm computes in fp32, multiplies by (1 + w.float()) and casts last. Gemma 1 reads hidden_act
    ("gelu" is rewritten to "gelu_pytorch_tanh"), Gemma 2/3 read hidden_activation.
  * Gemma 2 attention: scores = q k^T * query_pre_attn_scalar^-0.5, then cap * tanh(scores / cap), then the mask;
    final logits likewise capped by final_logit_softcapping. Gemma 3 has the config fields but its attention
    ignores attn_logit_softcapping (not passed to the attention function); final_logit_softcapping applies.
  * Gemma 3 rope_parameters is nested by layer type ({"full_attention": {...}, "sliding_attention": {...}});
    legacy configs (rope_theta, rope_local_base_freq, rope_scaling for the full layers only) are converted to it.
  * Cohere/Cohere2 RoPE: cos/sin = repeat_interleave(freqs, 2) and rotate_half pairs (x[2i], x[2i+1]) ->
    (-x[2i+1], x[2i]) (GPT-J style), computed in fp32. GLM: emb = cat(freqs, freqs) but apply_rotary takes its
    first half and repeat_interleaves it, then the same pairwise rotation on the first rotary_dim dims; the rest
    pass through. Phi-3 partial rotary: rotate_half (NeoX) within the first rotary_dim dims, rest pass through.
  * partial_rotary_factor is saved inside rope_parameters (Phi-3 also keeps it at top level); rotary dim =
    int(head_dim * factor), inv_freq over that dim.
  * Phi-3 longrope: original_max_position_embeddings at top level overrides the one in rope_parameters. In
    generate, Phi3ForCausalLM.prepare_inputs_for_generation drops the KV cache when input_ids (prompt + new, padding
    included) first reaches original_max_position_embeddings + 1 tokens, so that step recomputes every position
    with long_factor: Phi-3's greedy tokens equal a cache-free recomputation, unlike Llama longrope (cached keys
    keep their short-factor rotation).
  * Cohere2 full-attention layers use no RoPE at all. OLMo 1 and 2 compute RoPE in fp32 and cast q/k back.
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
MIN_ROUTE_GAP = 1e-3  # MoE: k-th minus (k+1)-th router probability, so rounding (e.g. TP sums) flips no expert
MAX_TRIES = 50
ROPE_DEFAULT = {"rope_type": "default", "rope_theta": 10000.0}
BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=64, rope_parameters=ROPE_DEFAULT,
            tie_word_embeddings=False, pad_token_id=0, bos_token_id=None, eos_token_id=None,
            attn_implementation="eager")
DROP = "<drop>"  # a FAMILY_BASE value: the family's config has no such field
# BASE adapted to a family: its own names for the norm eps, an explicit head_dim where the class's default is not
# hidden / heads, and tie_word_embeddings as the family's checkpoints have it.
FAMILY_BASE = {
    "gemma": dict(head_dim=16, tie_word_embeddings=True),
    "gemma2": dict(head_dim=16, tie_word_embeddings=True),
    "gemma3_text": dict(head_dim=16, tie_word_embeddings=True),
    "starcoder2": dict(rms_norm_eps=DROP, norm_epsilon=1e-5, tie_word_embeddings=True),
    "olmo": dict(rms_norm_eps=DROP),  # OLMo's LayerNorm has eps 1e-5 built in
    "cohere": dict(rms_norm_eps=DROP, layer_norm_eps=1e-5, tie_word_embeddings=True),
    "cohere2": dict(rms_norm_eps=DROP, layer_norm_eps=1e-5, tie_word_embeddings=True),
    "phi3": dict(original_max_position_embeddings=64),
    "glm": dict(head_dim=16),  # GLM's defaults: attention_bias True (q/k/v only), partial_rotary_factor 0.5
    "mixtral": dict(experts_implementation="eager"),  # not saved; also the feature-off models run HF's eager loop
    "qwen2_moe": dict(experts_implementation="eager"),
    "qwen3_moe": dict(experts_implementation="eager"),
}
# Gemma 3's RoPE per layer type (rope_theta + rope_local_base_freq, rope_scaling on the global layers before 5.x)
GEMMA3_ROPE = {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
               "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
FAMILIES = {  # family (model_type): transformers' config and causal-LM class names
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "granite": ("GraniteConfig", "GraniteForCausalLM"),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM"),
    "olmo": ("OlmoConfig", "OlmoForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "cohere": ("CohereConfig", "CohereForCausalLM"),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "glm": ("GlmConfig", "GlmForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}

# name: (family, config overrides, saved dtype, overrides that turn the tested feature off: None, one dict, or a list
# of dicts, one per feature)
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
    # The families beyond Llama/Mistral/Qwen (FAMILY_BASE adapts BASE to each).
    "gemma": ("gemma", {}, "float32", None),
    "gemma2": ("gemma2", dict(sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                              attn_logit_softcapping=2.0, final_logit_softcapping=5.0, query_pre_attn_scalar=24),
               "float32", [dict(layer_types=["full_attention"] * 2), dict(attn_logit_softcapping=None),
                           dict(final_logit_softcapping=None), dict(query_pre_attn_scalar=16)]),
    "gemma3": ("gemma3_text", dict(sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                                   query_pre_attn_scalar=24, rope_parameters=GEMMA3_ROPE),
               "float32", [dict(layer_types=["full_attention"] * 2),
                           dict(rope_parameters={**GEMMA3_ROPE, "sliding_attention": GEMMA3_ROPE["full_attention"]}),
                           dict(rope_parameters={**GEMMA3_ROPE, "full_attention": GEMMA3_ROPE["sliding_attention"]}),
                           dict(query_pre_attn_scalar=16)]),
    "granite": ("granite", dict(embedding_multiplier=2.0, attention_multiplier=0.15, residual_multiplier=0.5,
                                logits_scaling=0.5),
                "float32", [dict(embedding_multiplier=1.0), dict(attention_multiplier=0.25),
                            dict(residual_multiplier=1.0), dict(logits_scaling=1.0)]),
    "starcoder2": ("starcoder2", dict(sliding_window=5), "float32", dict(sliding_window=None)),
    "olmo": ("olmo", dict(clip_qkv=1.5), "float32", dict(clip_qkv=None)),
    # 4 key/value heads: the full-width k_norm spans them, so they are sharded, never replicated, at TP 4
    "olmo2": ("olmo2", dict(num_key_value_heads=4), "float32", None),
    "cohere": ("cohere", dict(logit_scale=2.0), "float32", dict(logit_scale=1.0)),
    "cohere_qk_norm": ("cohere", dict(logit_scale=2.0, use_qk_norm=True), "float32", dict(use_qk_norm=False)),
    "cohere2": ("cohere2", dict(logit_scale=2.0, sliding_window=5, layer_types=["sliding_attention", "full_attention"]),
                "float32", [dict(layer_types=["sliding_attention"] * 2), dict(sliding_window=4096)]),
    "phi3": ("phi3", dict(sliding_window=5), "float32", dict(sliding_window=None)),
    # bf16 files of the new parts: (1 + w) norms and soft-caps (Gemma 2), packed weights cut after the cast (Phi-3)
    "gemma2_bf16": ("gemma2", dict(sliding_window=5, layer_types=["sliding_attention", "full_attention"],
                                   attn_logit_softcapping=2.0, final_logit_softcapping=5.0), "bfloat16", None),
    "phi3_bf16": ("phi3", {}, "bfloat16", None),
    "phi3_longrope": ("phi3", dict(partial_rotary_factor=0.75, original_max_position_embeddings=16, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0,
        "short_factor": [round(1.0 + 0.1 * i, 1) for i in range(6)],  # 6 = int(head_dim * 0.75) / 2
        "long_factor": [2.0 + 0.5 * i for i in range(6)]}), "float32",
        [dict(rope_parameters=ROPE_DEFAULT), dict(rope_parameters=ROPE_DEFAULT, partial_rotary_factor=1.0)]),
    "glm": ("glm", {}, "float32", dict(partial_rotary_factor=1.0)),
    # mixtures of experts (routing gap and extra refs: see make_case_seeded)
    "mixtral": ("mixtral", dict(intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, sliding_window=5),
                "float32", dict(sliding_window=None)),
    "qwen2_moe": ("qwen2_moe", dict(intermediate_size=64, moe_intermediate_size=24, shared_expert_intermediate_size=40,
                                    num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
                                    decoder_sparse_step=1), "float32", dict(norm_topk_prob=True)),
    "qwen3_moe": ("qwen3_moe", dict(moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                                    head_dim=12), "float32", dict(norm_topk_prob=False)),
}


def family_classes(family):
    import transformers
    config_name, model_name = FAMILIES[family]
    return getattr(transformers, config_name), getattr(transformers, model_name)


def off_list(off_overrides):
    """The feature-off overrides as a list of dicts (None: [])."""
    if off_overrides is None:
        return []
    return [off_overrides] if isinstance(off_overrides, dict) else list(off_overrides)


def make_config(name, off=None):
    """The case's config; off: one of its feature-off override dicts, applied on top."""
    family, overrides, _, _ = CASES[name]
    config_class, _ = family_classes(family)
    kwargs = {**BASE, **FAMILY_BASE.get(family, {}), **overrides, **(off or {})}
    kwargs = {k: v for k, v in kwargs.items() if not (isinstance(v, str) and v == DROP)}
    config = config_class(**copy.deepcopy(kwargs))  # the config standardizes rope_parameters in place
    if name == "qwen2_sliding" and not off:
        assert config.layer_types == ["full_attention", "sliding_attention"], config.layer_types
    if "layer_types" in overrides and not off:
        assert config.layer_types == overrides["layer_types"], config.layer_types
    return config


def load(path, dtype="float32", attn="eager"):
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), attn_implementation=attn,
                                                experts_implementation="eager").eval()  # no-op for dense models


def load_bf16(path):
    """The files in bfloat16 with transformers' default attention (sdpa), except where a soft-cap needs the eager one
    (HF's sdpa path drops attn_logit_softcapping)."""
    import json
    with open(os.path.join(path, "config.json")) as f:
        softcap = json.load(f).get("attn_logit_softcapping")
    return load(path, "bfloat16", "eager" if softcap else "sdpa")


def positions(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)  # HF's forward does not derive positions from the mask


def logits_of(model, tokens, mask):
    import torch
    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=mask, position_ids=positions(mask)).logits.float()


def moe_forward(model, tokens, mask, **kw):
    """out (router_logits on) and the smallest k-th minus (k+1)-th router probability over sparse layers, real
    tokens."""
    import torch
    with torch.no_grad():
        out = model(input_ids=tokens, attention_mask=mask, position_ids=positions(mask), output_router_logits=True,
                    **kw)
    k = model.config.num_experts_per_tok
    top = torch.stack(out.router_logits).float().softmax(-1).topk(k + 1, dim=-1).values  # [n_sparse, B*S, k+1]
    return out, (top[..., k - 1] - top[..., k])[:, mask.flatten().bool()].min().item()


def greedy_with_gaps(model, ids, mask):
    """The new tokens of greedy generate [rows, steps] and each step's top-1 minus top-2 logit [rows, steps]."""
    import torch
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS,
                             min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None,
                             return_dict_in_generate=True, output_logits=True)
    top2 = torch.stack(out.logits, 1).float().topk(2, dim=-1).values  # [rows, steps, 2]
    return out.sequences[:, ids.shape[1]:].contiguous(), (top2[..., 0] - top2[..., 1]).contiguous()


def greedy(model, ids, mask):
    """The new tokens of greedy generate, and the smallest top-1 minus top-2 logit over all steps and rows."""
    tokens, gaps = greedy_with_gaps(model, ids, mask)
    return tokens, gaps.min().item()


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
    crc32(NAME) + k for the first k whose greedy runs have every top-1/top-2 logit gap >= MIN_GAP (and, MoE, every
    routing gap >= MIN_ROUTE_GAP)."""
    for k in range(MAX_TRIES):
        line, gap, route_gap = make_case_seeded(root, name, zlib.crc32(name.encode()) + k)
        if gap >= MIN_GAP and route_gap >= MIN_ROUTE_GAP:
            return line
    raise RuntimeError(f"{name}: no seed in {MAX_TRIES} tries gives top-2 gaps >= {MIN_GAP} "
                       f"and routing gaps >= {MIN_ROUTE_GAP}")


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
            p.copy_(1.0 + 0.1 * noise if "norm" in pname and not pname.endswith(".bias") else 0.2 * noise)
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
                "tie_word_embeddings", "attention_bias", "mlp_bias", "max_position_embeddings", "num_local_experts",
                "num_experts", "num_experts_per_tok", "norm_topk_prob", "mlp_only_layers", "decoder_sparse_step"):
        assert getattr(loaded.config, key, None) == getattr(model.config, key, None), key
    logits = logits_of(loaded, tokens, mask)
    greedy_one, gap_one = greedy(load(path), prompt, torch.ones_like(prompt))
    greedy_batch, gap_batch = greedy(load(path), batch, batch_mask)
    refs = {"tokens": tokens, "mask": mask, "logits": logits.contiguous(), "prompt": prompt,
            "greedy_one": greedy_one, "batch": batch, "batch_mask": batch_mask, "greedy_batch": greedy_batch}
    # The same files computed in bfloat16 (from_pretrained(dtype=torch.bfloat16): fp32 files cast on load), with each
    # greedy step's top-1 minus top-2 logit: where that margin is small, bf16 rounding may pick either token.
    refs["logits_bf16"] = logits_of(load_bf16(path), tokens, mask).contiguous()
    refs["greedy_one_bf16"], refs["gaps_one_bf16"] = greedy_with_gaps(load_bf16(path), prompt, torch.ones_like(prompt))
    refs["greedy_batch_bf16"], refs["gaps_batch_bf16"] = greedy_with_gaps(load_bf16(path), batch, batch_mask)
    route_gap = float("inf")
    if hasattr(model.config, "num_experts_per_tok"):  # MoE: routing margins and the router/aux-loss refs
        moe = load(path)
        out, route_gap = moe_forward(moe, tokens, mask, labels=tokens.masked_fill(mask == 0, -100))
        assert torch.equal(out.logits.float(), logits), f"{name}: router-logits forward differs"
        route_gap = min(route_gap, moe_forward(moe, prompt, torch.ones_like(prompt))[1],
                        moe_forward(moe, batch, batch_mask)[1])
        refs.update(aux_loss=out.aux_loss.float().reshape(()).contiguous(), loss=out.loss.float().contiguous(),
                    router_logits=torch.stack(out.router_logits).float().contiguous())
    save_file(refs, os.path.join(root, name + ".ref.safetensors"))

    gap = min(gap_one, gap_batch)
    line = f"{name:<15} seed=crc32+{seed - zlib.crc32(name.encode())} " \
           f"max|logit|={logits[mask.bool()].abs().max().item():6.3f}"
    diffs = []
    for off in off_list(off_overrides):  # the same weights with each feature turned off
        plain = model_class(make_config(name, off=off)).eval()
        missing, _ = plain.load_state_dict(load(path).state_dict(), strict=False)  # extra keys: e.g. qk norms off
        assert not missing, f"{name}: {missing} not in the checkpoint"
        diff = (logits_of(plain, tokens, mask) - logits)[mask.bool()].abs().max().item()
        assert diff > 1e-2, f"{name}: {sorted(off)} off does not change the logits on the test sequences"
        diffs.append(diff)
    if diffs:
        line += "  feature_off_diff=" + ",".join(f"{d:6.3f}" for d in diffs)
    line += f"  min_top2_gap={gap:.4f}"
    if route_gap != float("inf"):
        line += f"  min_route_gap={route_gap:.4f} aux_loss={refs['aux_loss'].item():.5f} loss={refs['loss'].item():.5f}"
    return line, gap, route_gap


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
