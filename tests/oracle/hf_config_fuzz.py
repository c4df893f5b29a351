"""The config fuzz: tiny checkpoints saved by transformers for every family, with the numerics fields of each config
class drawn from a printed seed (explicit nulls, absent keys, both values of every switch, every rope kind the class
accepts), generated greedily by transformers and by dtensor-cpp at TP 1 and TP 2. A case that loads, exits 0 and
answers differently from transformers fails; a case we refuse must be refused with a dtensor::Error (counted by
message).

    python hf_config_fuzz.py run --bin BUILD/bin [--seeds 0,1,2 | --seeds 0-99] [--families f1,f2] [--draws K]
                                 [--root DIR] [--keep]
        For each seed and family, K draws (default: the largest number of choices of any field of the family, so
        that every choice of every field appears at least once per seed: each field walks a permutation of its
        choices drawn from the seed). Writes the cases under ROOT (a temporary directory unless given), runs
        BUILD/bin/hf_config_fuzz_runner on them and compares. Prints a line per case and ends with
          summary runs=... same=... refused=... ties=... hf_refused=... silent_wrong=... roundtrip_wrong=...
        Exit 1 when any run answers differently with exit 0 (silent_wrong), or when our export of a config read
        back by transformers means something else (roundtrip_wrong).
    python hf_config_fuzz.py make ROOT --seed S [--families ...] [--draws K]
        Only writes the cases and ROOT/manifest.json (what the runner reads).

A case: config.json exactly as drawn (a key drawn ABSENT is left out, one drawn NULL is written as null), and the
weights of transformers' model for that file (AutoConfig reads the file; the model is built from it, its weights
redrawn away from HF's init: norm weights 1 + 0.3 * randn, biases and every other weight 0.2 * randn, or 0.8 * randn
in every other draw so that attention scores are large enough for soft-caps to matter, and saved).
When transformers refuses the file (a strict config field given null, a value its validation rejects), the case is
hf_refused: we must refuse it too, or count it as lenient (printed, not a failure: the promise is about files
transformers runs).

Near-ties: transformers' greedy run records, at each step, its top-1 minus top-2 logit. Tokens must be equal up to
the first step whose margin is below TIE (1e-3, about 1e-4 of the logits' scale here; fp32 reorderings move logits
by ~1e-6): what follows a near tie is not compared (counted as ties when it differs).
"""
import argparse
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

TIE = 1e-3
NEW_TOKENS = 12
VOCAB = 301


class FuzzError(Exception):
    pass


class _Sentinel:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name

    def __deepcopy__(self, memo):  # compared by identity
        return self


NULL = _Sentinel("NULL")      # written as null in config.json
ABSENT = _Sentinel("ABSENT")  # left out of config.json

# Sizes are fixed (64 hidden, 2 layers, 4 query heads, vocab 301): the fuzz varies what changes the numerics.
FIXED = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             bos_token_id=None, eos_token_id=None)

# Rope settings by kind; each sub-field may itself be drawn null or absent (rope_choices).
def rope_choices(rng, kinds, head_dim_half=8):
    kind = rng.choice(kinds)
    if kind in (NULL, ABSENT):
        return kind
    theta = rng.choice([10000.0, 500000.0, ABSENT])
    r = {"rope_type": kind}
    if theta is not ABSENT:
        r["rope_theta"] = theta
    def maybe(key, *values):
        v = rng.choice(list(values))
        if v is not ABSENT:
            r[key] = v
    if kind == "linear" or kind == "dynamic":
        r["factor"] = rng.choice([2.0, 4.0])
    elif kind == "llama3":
        r.update(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
        maybe("original_max_position_embeddings", 16, 8, ABSENT)
    elif kind == "yarn":
        maybe("factor", 4.0, 2.0)
        maybe("original_max_position_embeddings", 16, ABSENT)
        maybe("attention_factor", 1.3, NULL, ABSENT)
        maybe("beta_fast", 16.0, NULL, ABSENT)
        maybe("beta_slow", 2.0, NULL, ABSENT)
        maybe("mscale", 1.5, NULL, ABSENT)
        maybe("mscale_all_dim", 0.5, NULL, ABSENT)
        maybe("truncate", True, False, ABSENT)
    elif kind == "longrope":
        n = head_dim_half
        r["short_factor"] = [round(1.0 + 0.1 * i, 2) for i in range(n)]
        r["long_factor"] = [round(2.0 + 0.5 * i, 2) for i in range(n)]
        maybe("original_max_position_embeddings", 8, ABSENT)
        maybe("factor", 4.0, ABSENT)
        maybe("attention_factor", 1.2, NULL, ABSENT)
    return r


ROPE_KINDS = ["default", "linear", "dynamic", "yarn", "llama3", "longrope", NULL, ABSENT]
COMMON = {  # field: choices (only for families whose config class has the field)
    "num_key_value_heads": [4, 2, 1, NULL, ABSENT],
    "hidden_act": ["silu", "gelu", "gelu_pytorch_tanh", ABSENT],
    "max_position_embeddings": [64, 16, ABSENT],  # 16: the greedy run (8 + 12 tokens) goes past it
    "rms_norm_eps": [1e-5, 0.05, NULL, ABSENT],
    "tie_word_embeddings": [True, False, NULL, ABSENT],
    "attention_bias": [True, False, NULL, ABSENT],
    "mlp_bias": [True, False, NULL, ABSENT],
    "attention_dropout": [0.0, NULL, ABSENT],
    "pad_token_id": [0, NULL, ABSENT],
    "rope_parameters": "rope",
}
HEAD_DIM = [16, 24, NULL, ABSENT]
SLIDING = [5, 4096, NULL, ABSENT]
LAYER_TYPES = [["sliding_attention", "full_attention"], ["full_attention", "sliding_attention"],
               ["sliding_attention", "sliding_attention"], NULL, ABSENT]
QWEN_SLIDING = {"use_sliding_window": [True, False, NULL, ABSENT], "sliding_window": [5, NULL, ABSENT],
                "max_window_layers": [0, 1, 2, ABSENT], "layer_types": LAYER_TYPES}
GEMMA2 = {"hidden_activation": ["gelu_pytorch_tanh", "gelu", "silu", NULL, ABSENT], "head_dim": HEAD_DIM,
          "sliding_window": SLIDING, "layer_types": LAYER_TYPES, "query_pre_attn_scalar": [16, 24, 1, NULL, ABSENT],
          "attn_logit_softcapping": [2.0, NULL, ABSENT], "final_logit_softcapping": [5.0, NULL, ABSENT]}
MOE_QWEN = {"num_experts": [4], "moe_intermediate_size": [24], "num_experts_per_tok": [1, 2, ABSENT],
            "norm_topk_prob": [True, False, NULL, ABSENT], "decoder_sparse_step": [1, 2, ABSENT],
            "mlp_only_layers": [[], [1], NULL, ABSENT], "router_aux_loss_coef": [0.001, ABSENT]}
FAMILY_FIELDS = {
    "llama": {"head_dim": HEAD_DIM, "pretraining_tp": [1, NULL, ABSENT]},
    "mistral": {"head_dim": HEAD_DIM, "sliding_window": SLIDING},
    "qwen2": dict(QWEN_SLIDING),
    "qwen3": {"head_dim": HEAD_DIM, **QWEN_SLIDING},
    "gemma": {"head_dim": HEAD_DIM, "hidden_act": ["gelu_pytorch_tanh", "gelu", "silu", ABSENT],
              "hidden_activation": ["gelu_pytorch_tanh", "silu", NULL, ABSENT]},
    "gemma2": GEMMA2,
    "gemma3_text": {**GEMMA2, "rope_parameters": "rope_gemma3", "sliding_window_pattern": [2, 3, ABSENT]},
    "granite": {"embedding_multiplier": [2.0, 1.0, NULL, ABSENT], "attention_multiplier": [0.15, 1.0, NULL, ABSENT],
                "residual_multiplier": [0.5, 1.0, NULL, ABSENT], "logits_scaling": [0.5, 1.0, NULL, ABSENT]},
    "starcoder2": {"norm_epsilon": [1e-5, 0.05, NULL, ABSENT], "use_bias": [True, False, NULL, ABSENT],
                   "sliding_window": SLIDING, "residual_dropout": [0.0, NULL, ABSENT],
                   "embedding_dropout": [0.0, NULL, ABSENT]},
    "olmo": {"clip_qkv": [1.5, NULL, ABSENT]},
    "olmo2": {},
    "cohere": {"layer_norm_eps": [1e-5, 0.05, NULL, ABSENT], "logit_scale": [2.0, 0.0625, NULL, ABSENT],
               "use_qk_norm": [True, False, NULL, ABSENT]},
    "cohere2": {"layer_norm_eps": [1e-5, 0.05, NULL, ABSENT], "logit_scale": [2.0, NULL, ABSENT], "head_dim": HEAD_DIM,
                "sliding_window": SLIDING, "layer_types": LAYER_TYPES, "sliding_window_pattern": [2, ABSENT]},
    "phi3": {"sliding_window": SLIDING, "original_max_position_embeddings": [16, 64, NULL, ABSENT],
             "partial_rotary_factor": [0.75, 1.0, ABSENT], "resid_pdrop": [0.0, NULL, ABSENT],
             "embd_pdrop": [0.0, NULL, ABSENT], "pad_token_id": [0, NULL]},  # absent: 32000, past the vocab
    "glm": {"head_dim": HEAD_DIM, "partial_rotary_factor": [0.5, 1.0, ABSENT], "pad_token_id": [0, NULL]},
    "mixtral": {"head_dim": HEAD_DIM, "sliding_window": SLIDING, "num_local_experts": [4],
                "num_experts_per_tok": [1, 2, ABSENT], "router_jitter_noise": [0.0, NULL, ABSENT],
                "intermediate_size": [48]},
    "qwen2_moe": {**QWEN_SLIDING, **MOE_QWEN, "shared_expert_intermediate_size": [40, 0, ABSENT],
                  "qkv_bias": [True, False, NULL, ABSENT], "intermediate_size": [64]},
    "qwen3_moe": {**QWEN_SLIDING, **MOE_QWEN, "num_local_experts": [4], "head_dim": HEAD_DIM},
}
LEGACY_KWARGS = {"sliding_window_pattern"}  # Gemma 3, Cohere 2: the pattern when layer_types is absent
# The families' own names for the norm eps and fields their classes lack.
EPS_KEY = {"starcoder2": None, "cohere": None, "cohere2": None, "olmo": None}


def classes(family):
    import transformers
    sys.path.insert(0, os.path.dirname(__file__))
    from hf_family_oracle import FAMILIES
    config_name, model_name = FAMILIES[family]
    return getattr(transformers, config_name), getattr(transformers, model_name)


def space(family):
    """The family's fields and choices: COMMON where its class has the field, then its own."""
    config_class, _ = classes(family)
    defaults = config_class().to_dict()
    out = {}
    for k, v in COMMON.items():
        if k in defaults and not (k == "rms_norm_eps" and family in EPS_KEY):
            out[k] = v
    if family in ("gemma2", "gemma3_text"):
        out.pop("hidden_act", None)
    if defaults.get("num_key_value_heads", 0) > FIXED["num_attention_heads"]:  # absent: more kv heads than heads
        out["num_key_value_heads"] = [c for c in out["num_key_value_heads"] if c is not ABSENT]
    # Fields of the class, and the older files' keys its __post_init__ still reads from kwargs.
    out.update({k: v for k, v in FAMILY_FIELDS[family].items() if k in defaults or k in LEGACY_KWARGS})
    # A field whose dataclass refuses None (transformers >= 5 validates strictly) takes no null in the draws;
    # strict_null_case writes one such null per family and seed, which both sides must refuse.
    strict = []
    for key, choices in out.items():
        if isinstance(choices, list) and any(c is NULL for c in choices) and not accepts_null(config_class, key):
            out[key] = [c for c in choices if c is not NULL]
            strict.append(key)
    return out, strict


def accepts_null(config_class, key):
    try:
        config_class(**{key: None})
        return True
    except Exception:
        return False


def draw(family, seed, index, fields):
    """Case `index` of (family, seed): each field takes choice perm[index % n] of a permutation drawn from the seed,
    so K = max n draws see every choice of every field."""
    config = dict(FIXED)
    rng = random.Random(f"{seed}:{family}:{index}")
    for key, choices in fields.items():
        if isinstance(choices, str):  # rope
            continue
        perm = list(range(len(choices)))
        random.Random(f"{seed}:{family}:{key}").shuffle(perm)
        config[key] = copy.deepcopy(choices[perm[index % len(choices)]])
    if "rope_parameters" in fields:
        kinds = ROPE_KINDS
        perm = list(range(len(kinds)))
        random.Random(f"{seed}:{family}:rope").shuffle(perm)
        kind = kinds[perm[index % len(kinds)]]
        rope_rng = random.Random(f"{seed}:{family}:{index}:rope")
        if fields["rope_parameters"] == "rope_gemma3":
            if kind in (NULL, ABSENT):
                config["rope_parameters"] = kind
            else:
                full = rope_choices(random.Random(rope_rng.random()), [kind if kind not in ("longrope",) else "linear"])
                local = {"rope_type": "default", "rope_theta": rope_rng.choice([10000.0, 20000.0])}
                config["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
        else:
            half = 8  # head_dim / 2 for the default head_dim 16; longrope factors need head_dim / 2 (rotary dim)
            hd = config.get("head_dim")
            if isinstance(hd, int):
                half = hd // 2
            if family == "phi3" and config.get("partial_rotary_factor") == 0.75:
                half = int(16 * 0.75) // 2
            if family == "glm":
                prf = config.get("partial_rotary_factor", ABSENT)
                half = int((hd if isinstance(hd, int) else 128) * (0.5 if prf in (ABSENT, 0.5) else 1.0)) // 2
            config["rope_parameters"] = rope_choices(rope_rng, [kind], half)
    return config


def materialize(config):
    """The config.json dict: ABSENT keys dropped, NULL as None (recursively)."""
    if isinstance(config, dict):
        return {k: materialize(v) for k, v in config.items() if v is not ABSENT}
    if isinstance(config, list):
        return [materialize(v) for v in config]
    return None if config is NULL else config


def legacy_rope(file, rng):
    """Every other draw writes the rope as transformers 4.x files do: rope_theta at the top level, the scaling (if
    any) as rope_scaling, its kind under "type" or "rope_type"."""
    rope = file.get("rope_parameters")
    if not isinstance(rope, dict) or rng.random() < 0.5:
        return
    if "full_attention" in rope:  # Gemma 3's older keys: rope_theta, rope_local_base_freq, rope_scaling (full layers)
        full, local = dict(rope["full_attention"]), rope["sliding_attention"]
        if "rope_theta" not in full or "rope_theta" not in local:
            return
        del file["rope_parameters"]
        file["rope_theta"], file["rope_local_base_freq"] = full.pop("rope_theta"), local["rope_theta"]
        if full.get("rope_type", "default") != "default":
            file["rope_scaling"] = full
        return
    rope = dict(file.pop("rope_parameters"))
    if "rope_theta" in rope:
        file["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        if rng.random() < 0.5:
            rope["type"] = rope.pop("rope_type")
        file["rope_scaling"] = rope


def show(config):
    """The drawn fields, compact (FIXED left out)."""
    return json.dumps({k: materialize(v) if v is not ABSENT else "<absent>" for k, v in config.items()
                       if k not in FIXED}, separators=(",", ":"))


def make_case(root, family, seed, index, fields, null_key=None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    config = draw(family, seed, index, fields)
    if null_key:
        config[null_key] = NULL
    config_class, model_class = classes(family)
    name = f"s{seed}_{family}_{index}"
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    file = {"architectures": [model_class.__name__], "model_type": config_class.model_type, **materialize(config)}
    legacy_rope(file, random.Random(f"{seed}:{family}:{index}:format"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(file, f, indent=2)
    case = {"name": name, "family": family, "seed": seed, "index": index, "dir": path,
            "drawn": show(config) + (" (rope as rope_theta + rope_scaling)" if "rope_parameters" not in file else "")}
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    prompt = torch.randint(1, VOCAB, (1, 8), generator=g)
    case["prompt"] = prompt[0].tolist()
    # Weights 0.2 * randn, or 0.8 * randn every other draw: attention scores large enough that soft-caps, scales and
    # windows change the tokens.
    scale = (0.2, 0.8)[index % 2]
    case["weight_scale"] = scale
    try:
        hf_config = AutoConfig.from_pretrained(path)
        torch.manual_seed(zlib.crc32(name.encode()))
        model = model_class(hf_config).eval()
        with torch.no_grad():
            for pname, p in model.named_parameters():
                noise = torch.randn(p.shape, generator=g)
                norm_weight = "norm" in pname and not pname.endswith(".bias")
                p.copy_(1.0 + 0.3 * noise if norm_weight else scale * noise)
        model.save_pretrained(path)
        with open(os.path.join(path, "config.json"), "w") as f:  # the file as drawn, not HF's rewrite of it
            json.dump(file, f, indent=2)
        loaded, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                                            experts_implementation="eager", output_loading_info=True)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if bad:
            raise FuzzError(f"{name}: transformers' own save does not load back: {bad}")
        with torch.no_grad():
            out = loaded.eval().generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                         max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0,
                                         eos_token_id=None, return_dict_in_generate=True, output_logits=True)
        top2 = torch.stack(out.logits).float()[:, 0].topk(2, dim=-1).values
        case["hf_tokens"] = out.sequences[0, prompt.shape[1]:].tolist()
        case["hf_gaps"] = (top2[:, 0] - top2[:, 1]).tolist()
    except FuzzError:
        raise
    except Exception as e:  # transformers refuses the file (or cannot run it)
        case["hf_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return case


def make(root, seed, families, draws):
    cases = []
    for family in families:
        fields, strict = space(family)
        k = draws or max(len(c) if not isinstance(c, str) else len(ROPE_KINDS) for c in fields.values())
        for index in range(k):
            cases.append(make_case(root, family, seed, index, fields))
        if strict:  # one more draw with a field transformers refuses as null written null
            key = random.Random(f"{seed}:{family}:strict").choice(strict)
            cases.append(make_case(root, family, seed, k, fields, null_key=key))
    return cases


def compare(case, ours):
    """('same' | 'refused' | 'tie' | 'silent_wrong' | 'hf_refused' | 'lenient', detail) for one TP degree's result."""
    if "hf_error" in case:
        if "error" in ours:
            return "hf_refused", ours["error"]
        return "lenient", "transformers: " + case["hf_error"]
    if "error" in ours:
        return "refused", ours["error"]
    want, got = case["hf_tokens"], ours["tokens"]
    first_tie = next((i for i, gap in enumerate(case["hf_gaps"]) if gap < TIE), len(want))
    if got[:first_tie] != want[:first_tie]:
        step = next(i for i in range(first_tie) if got[i] != want[i])
        return "silent_wrong", f"step {step}: ours {got} transformers {want} (HF's top-2 margin there " \
                               f"{case['hf_gaps'][step]:.4f})"
    if got != want:
        return "tie", f"differs after a near tie at step {first_tie}"
    return "same", ""


def roundtrip_check(case):
    """Our export of the config, read back by transformers, means what the original means to transformers."""
    from transformers import AutoConfig
    ours = os.path.join(case["dir"], "ours")
    if "hf_error" in case or not os.path.exists(os.path.join(ours, "config.json")):
        return None
    a = AutoConfig.from_pretrained(case["dir"]).to_dict()
    b = AutoConfig.from_pretrained(ours).to_dict()
    skip = {"transformers_version", "architectures", "dtype", "torch_dtype", "_name_or_path", "bos_token_id",
            "eos_token_id", "use_cache", "initializer_range", "output_router_logits", "router_jitter_noise",
            "pretraining_tp", "attention_dropout", "residual_dropout", "embedding_dropout", "resid_pdrop", "embd_pdrop",
            "use_bidirectional_attention", "max_window_layers", "use_sliding_window", "_sliding_window_pattern",
            "sliding_window_pattern"}  # (what derived layer_types, which both sides write)
    def rope(r, max_pos):  # a None rope field means what its absence means (transformers reads them with .get())
        if not isinstance(r, dict):
            return r
        if "full_attention" in r or "sliding_attention" in r:  # (truncate: transformers reads it from the outer dict)
            return {k: {x: y for x, y in rope(v, max_pos).items() if x != "truncate"} if isinstance(v, dict) else v
                    for k, v in r.items()}
        r = {k: v for k, v in r.items() if v is not None and k != "type"}  # "type": the legacy name of rope_type
        if r.get("rope_type") == "yarn":
            r = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True, **r}
        if r.get("rope_type") in ("llama3", "yarn", "longrope"):  # absent: max_position_embeddings
            r.setdefault("original_max_position_embeddings", max_pos)
        return r
    for d in (a, b):
        d["rope_parameters"] = rope(d.get("rope_parameters"), d.get("max_position_embeddings"))
        if d.get("head_dim") is None:  # derived
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
        if "use_qk_norm" in d:  # None is off
            d["use_qk_norm"] = bool(d["use_qk_norm"])
    if case["family"] == "gemma3_text":  # its attention never applies attn_logit_softcapping (not exported)
        skip = skip | {"attn_logit_softcapping"}
    diffs = []
    for k in sorted(set(a) | set(b)):
        if k in skip:
            continue
        if a.get(k) != b.get(k):
            diffs.append(f"{k}: {a.get(k)!r} -> {b.get(k)!r}")
    return diffs


def parse_seeds(text):
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def main():
    from hf_family_oracle import FAMILIES
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["run", "make"])
    p.add_argument("root", nargs="?")
    p.add_argument("--bin", help="run: the build's bin directory (hf_config_fuzz_runner)")
    p.add_argument("--seeds", default="0")
    p.add_argument("--seed", type=int)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--draws", type=int, default=0, help="per family and seed (0: enough to see every choice)")
    p.add_argument("--keep", action="store_true", help="run: keep the cases' directory")
    a = p.parse_args()
    families = a.families.split(",")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        p.error(f"unknown families {unknown}; known: {', '.join(FAMILIES)}")

    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()

    if a.mode == "make":
        if not a.root or a.seed is None:
            p.error("make needs ROOT and --seed")
        cases = make(a.root, a.seed, families, a.draws)
        with open(os.path.join(a.root, "manifest.json"), "w") as f:
            json.dump(cases, f)
        return 0

    if not a.bin:
        p.error("run needs --bin")
    seeds = parse_seeds(a.seeds)
    root = a.root or tempfile.mkdtemp(prefix="dtensor_config_fuzz_")
    counts = {k: 0 for k in ("same", "refused", "tie", "silent_wrong", "hf_refused", "lenient")}
    refusals, failures, roundtrip_wrong = {}, [], []
    t0 = time.perf_counter()
    for seed in seeds:
        seed_root = os.path.join(root, f"seed{seed}")
        os.makedirs(seed_root, exist_ok=True)
        print(f"[fuzz] seed {seed}: transformers writes and runs the cases", flush=True)
        cases = make(seed_root, seed, families, a.draws)
        manifest = os.path.join(seed_root, "manifest.json")
        with open(manifest, "w") as f:
            json.dump(cases, f)
        print(f"[fuzz] seed {seed}: dtensor runs {len(cases)} cases at TP 1 and 2", flush=True)
        r = subprocess.run([os.path.join(a.bin, "hf_config_fuzz_runner"), manifest], capture_output=True, text=True,
                           timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if r.returncode != 0:
            print(r.stdout[-4000:], r.stderr[-4000:])
            print(f"summary error=runner_exit_{r.returncode}")
            return 1
        with open(os.path.join(seed_root, "results.json")) as f:
            results = {x["name"]: x for x in json.load(f)}
        for case in cases:
            res = results[case["name"]]
            for tp in ("1", "2"):
                verdict, detail = compare(case, res["tp" + tp])
                counts[verdict] += 1
                if verdict in ("refused", "hf_refused"):
                    msg = detail.split("': ", 1)[-1][:160]
                    refusals[msg] = refusals.get(msg, 0) + 1
                if verdict in ("silent_wrong", "lenient") or (verdict != "same"):
                    print(f"  {case['name']:<24} TP {tp} {verdict:<12} {detail[:300]}")
                if verdict == "silent_wrong":
                    failures.append(f"{case['name']} TP {tp}: {detail}\n    drawn: {case['drawn']}")
            diffs = roundtrip_check(case)
            if diffs:
                roundtrip_wrong.append(f"{case['name']}: {'; '.join(diffs)}\n    drawn: {case['drawn']}")
            if res.get("self_roundtrip"):
                roundtrip_wrong.append(f"{case['name']}: our own export reads back as {res['self_roundtrip']}")
    print("[fuzz] refusals by message:")
    for msg, n in sorted(refusals.items(), key=lambda x: -x[1]):
        print(f"  {n:4d}  {msg}")
    for f in failures:
        print("[fuzz] SILENT WRONG " + f)
    for f in roundtrip_wrong:
        print("[fuzz] ROUNDTRIP WRONG " + f)
    runs = sum(counts.values())
    print(f"summary seeds={a.seeds} runs={runs} " + " ".join(f"{k}={v}" for k, v in counts.items()) +
          f" roundtrip_wrong={len(roundtrip_wrong)} tie_margin={TIE} seconds={time.perf_counter() - t0:.0f}")
    if not a.keep and not a.root:
        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures or roundtrip_wrong else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
