"""Hugging Face transformers on the other side of the C++ tests of our chat-template (Jinja subset) engine.

    python hf_chat_template_oracle.py make ROOT [--templates a,b,...]
        For each template NAME in TEMPLATES (default: all; real chat templates of public checkpoints, stored verbatim
        as files tests/data/chat_templates/NAME.jinja, each checked against its SHA-256 in TEMPLATE_SHA256), builds
        a tiny tokenizers byte-level BPE tokenizer (no merges) whose vocabulary holds that family's special tokens
        (FAMILIES) and saves it with transformers'
        PreTrainedTokenizerFast(tokenizer_object=..., bos_token=..., eos_token=..., ..., chat_template=...)
        .save_pretrained(ROOT/NAME). The chat template lands in one of three layouts (LAYOUT below):
          "jinja"   ROOT/NAME/chat_template.jinja (what transformers 5 writes by default; tokenizer_config.json has
                    no "chat_template")
          "config"  "chat_template" inside ROOT/NAME/tokenizer_config.json, as older checkpoints ship it
                    (save_pretrained(..., save_jinja_files=False); no chat_template.jinja)
          "both"    chat_template.jinja holds the template and tokenizer_config.json holds a stale DECOY_TEMPLATE:
                    transformers reads chat_template.jinja when it exists, so a loader that reads the config renders
                    the decoy, which raises.
        Then loads ROOT/NAME with transformers.AutoTokenizer (checking that tok.chat_template is the stored template
        byte for byte) and renders every case of cases_for(NAME) with
            tok.apply_chat_template(messages, tools=tools, add_generation_prompt=..., tokenize=False, **kwargs)
        with strftime_now's clock fixed at NOW (transformers' datetime patched), and writes
          ROOT/cases.jsonl   one object per case, in template order:
              {"template": NAME, "case": CASE_ID, "dir": "ROOT/NAME", "layout": "jinja"|"config"|"both",
               "messages": [...] (what was passed to apply_chat_template),
               "template_messages": [...] (what the template saw as `messages`: transformers drops every key whose
                   value is null from each message, then, where a message has a non-null "reasoning_content",
                   "thinking" or "reasoning", rebuilds it as {"thinking": r, **message, "reasoning_content": r}
                   with r the first of those three that is set),
               "add_generation_prompt": bool, "tools": [...] or null,
               "kwargs": {...} (extra template variables passed as **kwargs, e.g. date_string, enable_thinking),
               "now": "2025-03-15T12:00:00" (strftime_now's clock), "depends_on_now": bool (the output changes when
                   the clock does: only templates that call strftime_now without a date_string),
               "expected": "<rendered string>"}  or, when rendering raised, instead of "expected":
               "error": "<str(exception)>", "error_type": "TemplateError" (raise_exception(msg): the message is the
                   template's own text) | "UndefinedError" (jinja2's wording, e.g. "'dict object' has no attribute
                   'content'"; compare only the type) | ...
          ROOT/NAME/expected_specials.json   tok.special_tokens_map: the named special tokens (bos_token,
              eos_token, unk_token, pad_token, only those set) that apply_chat_template passes into the template as
              variables; a family without a BOS (Qwen) has no "bos_token", which is then undefined in the template.
          ROOT/manifest.json   {NAME: {"layout", "sha256", "chars", "source", "special_tokens_map"}}
        The variables a template sees are exactly: messages (template_messages), tools (the list or None: always
        defined), documents (None), add_generation_prompt, every key of expected_specials.json, every key of kwargs
        (kwargs win over the special tokens).
        Self-check: every case is also rendered directly with jinja2 in make_env(), the environment transformers 5
        builds in transformers/utils/chat_template_utils.py (ImmutableSandboxedEnvironment(trim_blocks=True,
        lstrip_blocks=True, extensions=[a "generation" block tag that renders its body, jinja2.ext.loopcontrols]);
        autoescape off, keep_trailing_newline False, Undefined = jinja2.Undefined; filter tojson(x,
        ensure_ascii=False, indent=None, separators=None, sort_keys=False) = json.dumps with those options; globals
        raise_exception(msg) raising jinja2.exceptions.TemplateError(msg), strftime_now(fmt) =
        datetime.now().strftime(fmt), dict (callable, plus .fromkeys), namespace (jinja2's Namespace refusing names
        starting with "_")), from template_messages and the variables above, and must give the same string or the
        same exception type and text. Also checks that every template raises in at least one case where it has an
        error path, and that NOW matters where a template calls strftime_now. Deterministic, offline; about 3 s.
    python hf_chat_template_oracle.py constructs [--templates a,b,...] [--json]
        Prints, per template, the Jinja constructs it uses, found by walking jinja2's lexer tokens and parse tree
        (not by hand): statements (for, for-if, for-else, tuple unpacking, if/elif/else, set, set ns.attr, macro,
        call, filter block, generation, break/continue), filters (with the keyword arguments used), tests (with
        "is not"), tests named as strings in select/reject/selectattr/rejectattr, method calls (.strip() ...),
        global function calls (namespace(), raise_exception() ...), loop.* variables, other attribute names,
        subscripts and slices, operators (+ - * / // % ** ~ == != < <= > >= in, not in, and, or, not, unary -),
        conditional expressions (with or without else), literals (list, dict, tuple, str/int/float/bool/none
        constants), whitespace control markers ({%- -%} {{- -}} {#- -#} {%+), comments, escape sequences inside
        string literals, the context variables the template reads (jinja2.meta.find_undeclared_variables less the
        names it only sets itself, plus those it probes with "is defined"), and how many of its cases change when
        trim_blocks or lstrip_blocks is turned off or keep_trailing_newline on. "is not X" stands for both
        "x is not X" and "not x is X" (jinja2 parses both as not (x is X)). Ends with the union over the
        templates. --json prints one JSON object instead.
    python hf_chat_template_oracle.py list
        Prints NAME layout sha256 source, one line per template.
Exit status 0 when everything worked and matched; 1 otherwise.
"""
import argparse
import copy
import datetime as _datetime
import hashlib
import json
import os
import sys
import time

# strftime_now's clock for every case (a local, naive time, as datetime.now() gives). Its month name in "%d %b %Y"
# comes from the C locale, the one Python runs in unless a program calls setlocale.
NOW = _datetime.datetime(2025, 3, 15, 12, 0, 0)
OTHER_NOW = _datetime.datetime(2031, 11, 2, 8, 30, 0)  # only to find the cases whose output depends on the clock

# A stale template put into tokenizer_config.json next to a chat_template.jinja (layout "both").
DECOY_TEMPLATE = ("{{ raise_exception('stale tokenizer_config.json chat_template: transformers reads "
                  "chat_template.jinja when it exists') }}")

# The chat templates, verbatim, one file each: tests/data/chat_templates/NAME.jinja (TEMPLATE_DIR) holds exactly the
# template's text, UTF-8, with nothing added (no trailing newline unless the template ends with one). TEMPLATE_SHA256
# guards the bytes. SOURCES: the checkpoint, then where the text was taken from (a copy in a public GitHub
# repository; "identical" = a second, independent copy compared equal).
SOURCES = {
    'llama3_1_instruct': (
        "meta-llama/Llama-3.1-8B-Instruct -- from huggingface/huggingface.js packages/jinja/test/e2e.test.js "
        "(commit ee92cdbe6f08) key \"meta-llama/Llama-3.1-8B-Instruct\"; identical to the GGUF copy of ollama "
        "library/llama3.1:8b in huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts"
        " (commit 007948d5aac3)"),
    'llama3_2_instruct': (
        "meta-llama/Llama-3.2-3B-Instruct -- from huggingface/huggingface.js "
        "packages/ollama-utils/src/chat-template-automap.ts (commit 007948d5aac3) model library/llama3.2:3b "
        "(\"gguf\"); same text length (3827) as ggerganov/llama.cpp "
        "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja (commit 7b5e0803c844)"),
    'llama2_chat': (
        "meta-llama/Llama-2-7b-chat-hf -- from huggingface/huggingface.js "
        "packages/ollama-utils/src/chat-template-automap.ts (commit 007948d5aac3) model library/llama2:7b "
        "(\"gguf\")"),
    'mistral_v0_1_instruct': (
        "mistralai/Mistral-7B-Instruct-v0.1 (original template, via TheBloke/Mistral-7B-Instruct-v0.1-GPTQ) "
        "-- from huggingface/huggingface.js packages/jinja/test/e2e.test.js (commit ee92cdbe6f08) key "
        "\"TheBloke/Mistral-7B-Instruct-v0.1-GPTQ\"; identical in huggingface/swift-jinja "
        "Tests/JinjaTests/IntegrationTests.swift (commit 0b67ecb79139) and in huggingface/huggingface.js "
        "packages/ollama-utils/src/chat-template-automap.ts (commit 007948d5aac3) model "
        "library/mistral:7b-instruct-fp16"),
    'mistral_v0_3_instruct': (
        "mistralai/Mistral-7B-Instruct-v0.3 (2024 tool-use revision) -- from huggingface/huggingface.js "
        "packages/jinja/test/e2e.test.js (commit ee92cdbe6f08) key \"mistralai/Mistral-7B-Instruct-v0.3 (JSON "
        "Schema)\" (added in huggingface.js commit 717d69d8ad11); the Hub's later revision adds system-message"
        " support and 9-character tool-call-id checks, see mistral_nemo_instruct_2407 for that style"),
    'mistral_nemo_instruct_2407': (
        "mistralai/Mistral-Nemo-Instruct-2407 -- from huggingface/huggingface.js "
        "packages/jinja/test/e2e.test.js (commit ee92cdbe6f08) key \"mistralai/Mistral-Nemo-Instruct-2407\"; "
        "identical in huggingface/swift-jinja Tests/JinjaTests/IntegrationTests.swift (commit 0b67ecb79139)"),
    'qwen2_5_instruct': (
        "Qwen/Qwen2.5-7B-Instruct -- from google/minja third_party/templates/Qwen-Qwen2.5-7B-Instruct.jinja "
        "(commit ca30ee6b8f0c, fetched from the Hub by its script); identical to huggingface/huggingface.js "
        "packages/jinja/test/e2e.test.js (commit ee92cdbe6f08) key \"Qwen/Qwen2.5-7B-Instruct\""),
    'qwen3': (
        "Qwen/Qwen3-0.6B -- from huggingface/huggingface.js packages/jinja/test/e2e.test.js (commit "
        "ee92cdbe6f08) key \"Qwen/Qwen3-0.6B\"; identical to huggingface/huggingface.js "
        "packages/ollama-utils/src/chat-template-automap.ts (commit 007948d5aac3) model library/qwen3:0.6b"),
    'gemma_it': (
        "google/gemma-2-2b-it (the same text as google/gemma-2b-it / gemma-7b-it) -- from "
        "huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts (commit 007948d5aac3) "
        "model library/gemma2:2b; identical to huggingface/swift-jinja "
        "Tests/JinjaTests/IntegrationTests.swift \"Google Gemma-2B-IT\" (commit 0b67ecb79139)"),
    'gemma3_it': (
        "google/gemma-3-270m-it (the later Gemma 3 revision that also accepts a string system message) -- "
        "from huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts (commit "
        "007948d5aac3) model library/gemma3:270m"),
    'phi3_mini_instruct': (
        "microsoft/Phi-3-mini-4k-instruct -- from google/minja "
        "third_party/templates/microsoft-Phi-3-mini-4k-instruct.jinja (commit ca30ee6b8f0c); identical to "
        "huggingface/huggingface.js packages/ollama-utils/src/chat-template-automap.ts (commit 007948d5aac3) "
        "model library/phi3:3.8b"),
    'zephyr_7b_beta': (
        "HuggingFaceH4/zephyr-7b-beta -- from huggingface/huggingface.js packages/jinja/test/e2e.test.js "
        "(commit ee92cdbe6f08) key \"HuggingFaceH4/zephyr-7b-beta (add_generation_prompt=false)\"; identical in"
        " huggingface/swift-jinja Tests/JinjaTests/IntegrationTests.swift (commit 0b67ecb79139)"),
    'smollm2_instruct': (
        "HuggingFaceTB/SmolLM2-135M-Instruct (ChatML) -- from huggingface/huggingface.js "
        "packages/ollama-utils/src/chat-template-automap.ts (commit 007948d5aac3) model library/smollm2:135m"),
    'deepseek_r1': (
        "deepseek-ai/DeepSeek-R1 -- from huggingface/huggingface.js packages/jinja/test/e2e.test.js (commit "
        "ee92cdbe6f08) key \"deepseek-ai/DeepSeek-R1\""),
}
# The templates in order: the order of TEMPLATES, of `list`, of manifest.json and of cases.jsonl.
TEMPLATE_NAMES = (
    'llama3_1_instruct',           # meta-llama/Llama-3.1-8B-Instruct
    'llama3_2_instruct',           # meta-llama/Llama-3.2-3B-Instruct
    'llama2_chat',                 # meta-llama/Llama-2-7b-chat-hf
    'mistral_v0_1_instruct',       # mistralai/Mistral-7B-Instruct-v0.1
    'mistral_v0_3_instruct',       # mistralai/Mistral-7B-Instruct-v0.3
    'mistral_nemo_instruct_2407',  # mistralai/Mistral-Nemo-Instruct-2407
    'qwen2_5_instruct',            # Qwen/Qwen2.5-7B-Instruct
    'qwen3',                       # Qwen/Qwen3-0.6B
    'gemma_it',                    # google/gemma-2-2b-it
    'gemma3_it',                   # google/gemma-3-270m-it
    'phi3_mini_instruct',          # microsoft/Phi-3-mini-4k-instruct
    'zephyr_7b_beta',              # HuggingFaceH4/zephyr-7b-beta
    'smollm2_instruct',            # HuggingFaceTB/SmolLM2-135M-Instruct
    'deepseek_r1',                 # deepseek-ai/DeepSeek-R1
)
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "chat_templates")


def load_template(name):
    """The text of TEMPLATE_DIR/NAME.jinja: its bytes decoded as UTF-8, nothing stripped or translated."""
    with open(os.path.join(TEMPLATE_DIR, name + ".jinja"), "rb") as f:
        return f.read().decode("utf-8")


TEMPLATES = {name: load_template(name) for name in TEMPLATE_NAMES}

TEMPLATE_SHA256 = {
    'llama3_1_instruct': 'e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65',
    'llama3_2_instruct': '5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4',
    'llama2_chat': 'e8d5b5a546d3f19df16a5320c614fab05bdc4edd50e850f1afd947b503ea41cf',
    'mistral_v0_1_instruct': '7e995b379ec01747807246483647cd99030abf331653f1119e16d7ac041a3495',
    'mistral_v0_3_instruct': '225aaeb28812e3ea17ec7ce3963b705811ea431cfefc8cef624e0f2930f8e7e3',
    'mistral_nemo_instruct_2407': '7a29791b46bd731f43fbe4994f23c7b689daaa36c4d0294485fab19825a2ec5d',
    'qwen2_5_instruct': 'cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f',
    'qwen3': '87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5',
    'gemma_it': 'ecd6ae513fe103f0eb62e8ab5bfa8d0fe45c1074fa398b089c93a7e70c15cfd6',
    'gemma3_it': '7de1c58e208eda46e9c7f86397df37ec49883aeece39fb961e0a6b24088dd3c4',
    'phi3_mini_instruct': 'dcaee66df77bfbb789ec541fe713218da30225a526f1db97138fc39ee6dc56aa',
    'zephyr_7b_beta': '66291cf0045c2425a3a667cf3cbb7af2b11f09e025c02f97245323ab79119362',
    'smollm2_instruct': '872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788',
    'deepseek_r1': '3a3036eeb96ca0e48565fc1f19b4d7d3fa17ada32bb1b3d5ed539ae74cf22923',
}

# Special tokens of each template's family, as the real tokenizer_config.json files name them. "extra": further
# special tokens (additional_special_tokens / extra_special_tokens); "added": non-special added tokens. Tokens the
# templates write but the checkpoints do not list stay plain text here too.
FAMILIES = {
    "llama3_1_instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                          "extra": ["<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                                    "<|python_tag|>", "<|finetune_right_pad_id|>"]},
    "llama3_2_instruct": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                          "extra": ["<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>",
                                    "<|python_tag|>", "<|finetune_right_pad_id|>"]},
    "llama2_chat": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral_v0_1_instruct": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "mistral_v0_3_instruct": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                              "extra": ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                        "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]},
    "mistral_nemo_instruct_2407": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                   "extra": ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                                             "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]},
    "qwen2_5_instruct": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                         "extra": ["<|im_start|>", "<|im_end|>"], "added": ["<tool_call>", "</tool_call>"]},
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "extra": ["<|im_start|>", "<|im_end|>"],
              "added": ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]},
    "gemma_it": {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
                 "extra": ["<start_of_turn>", "<end_of_turn>"]},
    "gemma3_it": {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
                  "extra": ["<start_of_turn>", "<end_of_turn>", "<start_of_image>"]},
    "phi3_mini_instruct": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>",
                           "pad_token": "<|endoftext|>",
                           "extra": ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]},
    "zephyr_7b_beta": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"},
    "smollm2_instruct": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                         "pad_token": "<|im_end|>", "extra": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]},
    "deepseek_r1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
                    "pad_token": "<｜end▁of▁sentence｜>",
                    "extra": ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"]},
}

# Where the template goes: about half in tokenizer_config.json (the older checkpoints), one in both places.
LAYOUT = {
    "llama3_1_instruct": "jinja", "llama3_2_instruct": "jinja", "llama2_chat": "config",
    "mistral_v0_1_instruct": "config", "mistral_v0_3_instruct": "config", "mistral_nemo_instruct_2407": "jinja",
    "qwen2_5_instruct": "config", "qwen3": "jinja", "gemma_it": "config", "gemma3_it": "jinja",
    "phi3_mini_instruct": "config", "zephyr_7b_beta": "config", "smollm2_instruct": "both", "deepseek_r1": "jinja",
}

# Templates that take tools; templates whose cases must include a raise.
TOOL_TEMPLATES = {"llama3_1_instruct", "llama3_2_instruct", "mistral_v0_3_instruct", "mistral_nemo_instruct_2407",
                  "qwen2_5_instruct", "qwen3", "deepseek_r1"}
MUST_RAISE = {"llama3_1_instruct", "llama3_2_instruct", "llama2_chat", "mistral_v0_1_instruct",
              "mistral_nemo_instruct_2407", "gemma_it", "gemma3_it", "deepseek_r1"}

# ---------------------------------------------------------------------------------------------------------------
# Test data

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_temperature",
        "description": "Get the current temperature at a location (°C or °F).",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string",
                             "description": "The location to get the temperature for, in the format \"City, Country\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                         "description": "The unit to return the temperature in."},
            },
            "required": ["location", "unit"],
        },
        "return": {"type": "number", "description": "The current temperature at the location, as a float."},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a time zone — e.g. “Europe/Paris”.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
CALL_ID = "call12345"  # Mistral's templates want 9 alphanumeric characters
WEATHER_ARGS = {"location": "Paris, France", "unit": "celsius"}
TIME_ARGS = {"tz": "Europe/Paris"}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello, how are you?"}
A1 = {"role": "assistant", "content": "I'm doing great. How can I help you today?"}
U2 = {"role": "user", "content": "What is 2 + 2?"}
A2 = {"role": "assistant", "content": "2 + 2 = 4."}
UNI_U = {"role": "user", "content": "  Grüße, 世界! 👋🏽 naïve café\n\tsecond line with a tab  \n\n"}
UNI_A = {"role": "assistant", "content": " \n Sure — here you go: ✨ «ok» \n"}
UNI_U2 = {"role": "user", "content": "Ünïcödé? 🤔 ¿Qué tal? Привет! こんにちは"}
JINJA_U = {"role": "user", "content": "Print {{ messages }} and {% if x %}y{% endif %} {# not a comment #} literally."}


def user(text):
    return {"role": "user", "content": text}


def assistant(text, **kw):
    return {"role": "assistant", "content": text, **kw}


def tool_call(name, args, call_id=CALL_ID):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def tool_msg(content, name="get_current_temperature", call_id=CALL_ID):
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def case(cid, messages, agp=False, tools=None, **kwargs):
    return {"case": cid, "messages": copy.deepcopy(messages), "add_generation_prompt": agp,
            "tools": copy.deepcopy(tools), "kwargs": kwargs}


def generic_cases(name, **kw):
    """The cases every template gets (some raise on some templates: that is recorded)."""
    return [
        case("user", [U1], False, **kw),
        case("user_gen", [U1], True, **kw),
        case("system_user_gen", [SYS, U2], True, **kw),
        case("multi_turn_gen", [U1, A1, U2], True, **kw),
        case("multi_turn_nogen", [U1, A1, U2, A2], False, **kw),
        case("system_multi_turn", [SYS, U1, A1, U2], True, **kw),
        case("unicode_whitespace", [UNI_U, UNI_A, UNI_U2], True, **kw),
        case("jinja_like_content", [JINJA_U], True, **kw),
        case("empty_content", [user("")], True, **kw),
        case("non_alternating", [U1, U2], True, **kw),
        case("assistant_first", [A1, U2], True, **kw),
        case("system_only", [SYS], True, **kw),
    ]


def tool_roundtrip(args=WEATHER_ARGS, content="22.0", assistant_content=None):
    return [
        user("What's the temperature in Paris right now?"),
        assistant(assistant_content, tool_calls=[tool_call("get_current_temperature", args)]),
        tool_msg(content),
    ]


def cases_for(name):
    c = []
    if name == "llama3_1_instruct":
        c += generic_cases(name)
        c += [
            case("date_string", [SYS, U1], True, date_string="15 Mar 2025"),
            case("tools", [SYS, user("What's the temperature in Paris right now?")], True, tools=[WEATHER_TOOL]),
            case("tools_in_system", [SYS, user("What's the temperature in Paris right now?")], True,
                 tools=[WEATHER_TOOL, TIME_TOOL], tools_in_user_message=False),
            case("tool_roundtrip", [SYS] + tool_roundtrip(), True, tools=[WEATHER_TOOL]),
            case("tool_dict_content", tool_roundtrip()[:2] + [
                {"role": "tool", "content": {"temperature": 22.0, "unit": "celsius"}}], True, tools=[WEATHER_TOOL]),
            case("ipython_role", [U2, assistant(None, tool_calls=[tool_call("get_time", TIME_ARGS)]),
                                  {"role": "ipython", "content": ["12:00", 42]}], True, tools=[TIME_TOOL]),
            case("builtin_tools", [SYS, user("Search the weather in Paris"),
                                   assistant(None, tool_calls=[tool_call("brave_search",
                                                                         {"query": "weather in Paris"})]),
                                   {"role": "tool", "content": "Sunny, 22 °C"}], True,
                 builtin_tools=["brave_search", "wolfram_alpha", "code_interpreter"]),
            case("custom_tools_kwarg", [user("Time in Paris?")], True, custom_tools=[TIME_TOOL]),
            case("error_two_tool_calls", [U2, assistant(None, tool_calls=[tool_call("get_time", TIME_ARGS),
                                                                          tool_call("get_time", {"tz": "UTC"})])],
                 True, tools=[TIME_TOOL]),
            case("error_tools_no_user", [SYS], True, tools=[WEATHER_TOOL]),
        ]
    elif name == "llama3_2_instruct":
        d = {"date_string": "02 Jan 2025"}
        c += generic_cases(name, **d)
        c += [
            case("strftime_now", [SYS, U1], True),
            case("strftime_now_tools", [user("What's the temperature in Paris right now?")], True,
                 tools=[WEATHER_TOOL]),
            case("tools", [SYS, user("What's the temperature in Paris right now?")], True, tools=[WEATHER_TOOL],
                 **d),
            case("tools_in_system", [SYS, user("What's the temperature in Paris right now?")], True,
                 tools=[WEATHER_TOOL], tools_in_user_message=False, **d),
            case("tool_roundtrip", [SYS] + tool_roundtrip(), True, tools=[WEATHER_TOOL], **d),
            case("tool_dict_content", tool_roundtrip()[:2] + [
                {"role": "tool", "content": {"temperature": 22.0, "unit": "celsius"}}], True, tools=[WEATHER_TOOL],
                **d),
            case("error_two_tool_calls", [U2, assistant(None, tool_calls=[tool_call("get_time", TIME_ARGS),
                                                                          tool_call("get_time", {"tz": "UTC"})])],
                 True, tools=[TIME_TOOL], **d),
            case("error_tools_no_user", [SYS], True, tools=[WEATHER_TOOL], **d),
        ]
    elif name == "llama2_chat":
        c += generic_cases(name)
        c += [case("error_system_then_assistant", [SYS, A1], False)]
    elif name == "mistral_v0_1_instruct":
        c += generic_cases(name)
        c += [case("error_role", [U1, {"role": "system", "content": "Be brief."}], True),
              case("error_tool_role", [U1, A1, tool_msg("22.0")], True)]
    elif name == "mistral_v0_3_instruct":
        c += generic_cases(name)
        c += [
            case("tools", [SYS, U1, A1, user("What's the temperature in Paris right now?")], False,
                 tools=[WEATHER_TOOL, TIME_TOOL]),
            case("tool_roundtrip", tool_roundtrip(), False, tools=[WEATHER_TOOL]),
            case("tool_dict_content", tool_roundtrip(content={"temperature": 22.0, "unit": "celsius"}), False,
                 tools=[WEATHER_TOOL]),
            case("tool_two_calls_then_answer",
                 [user("Weather and time in Paris?"),
                  assistant(None, tool_calls=[tool_call("get_current_temperature", WEATHER_ARGS),
                                              tool_call("get_time", TIME_ARGS, "call67890")]),
                  tool_msg("22.0"), tool_msg("12:00", "get_time", "call67890"),
                  assistant("It is 22 °C and 12:00 in Paris.")], False, tools=[WEATHER_TOOL, TIME_TOOL]),
        ]
    elif name == "mistral_nemo_instruct_2407":
        c += generic_cases(name)
        c += [
            case("tools", [SYS, U1, A1, user("What's the temperature in Paris right now?")], False,
                 tools=[WEATHER_TOOL, TIME_TOOL]),
            case("tool_roundtrip", tool_roundtrip(), False, tools=[WEATHER_TOOL]),
            case("tool_roundtrip_answer", tool_roundtrip() + [assistant("It is 22 °C in Paris.")], False,
                 tools=[WEATHER_TOOL]),
            case("openai_style_nulls", [U1, assistant("Hi!", tool_calls=None, name=None), U2], False),
            case("error_bad_call_id", [user("Time?"), assistant(None, tool_calls=[tool_call("get_time", TIME_ARGS,
                                                                                             "call_1")])], False,
                 tools=[TIME_TOOL]),
        ]
    elif name == "qwen2_5_instruct":
        c += generic_cases(name)
        c += [
            case("tools", [user("What's the temperature in Paris right now?")], True, tools=[WEATHER_TOOL]),
            case("tools_system", [SYS, user("What's the temperature in Paris right now?")], True,
                 tools=[WEATHER_TOOL, TIME_TOOL]),
            case("tool_roundtrip", tool_roundtrip(), True, tools=[WEATHER_TOOL]),
            case("tool_two_calls", [user("Weather and time in Paris?"),
                                    assistant("Let me check.",
                                              tool_calls=[tool_call("get_current_temperature", WEATHER_ARGS),
                                                          tool_call("get_time", TIME_ARGS, "call67890")]),
                                    tool_msg("22.0"), tool_msg("12:00", "get_time", "call67890")], True,
                 tools=[WEATHER_TOOL, TIME_TOOL]),
            case("second_system", [SYS, U1, {"role": "system", "content": "Answer in French."}, U2], True),
        ]
    elif name == "qwen3":
        c += generic_cases(name)
        c += [
            case("enable_thinking_false", [U2], True, enable_thinking=False),
            case("enable_thinking_true", [U2], True, enable_thinking=True),
            case("reasoning_in_history", [U2, assistant("4.", reasoning_content="Simple addition: 2 + 2 = 4."),
                                          user("And 3 + 3?")], True),
            case("reasoning_last_turn", [U2, assistant("4.", reasoning_content="\nSimple addition.\n")], False),
            case("reasoning_alias_thinking", [U2, assistant("4.", thinking="Via the 'thinking' key.")], False),
            case("inline_think_last", [U2, assistant("<think>\nLet me add.\n</think>\n\n2 + 2 = 4.")], False),
            case("inline_think_history", [U2, assistant("<think>\nLet me add.\n</think>\n\n2 + 2 = 4."),
                                          user("Thanks!")], True, enable_thinking=False),
            case("tools", [SYS, user("What's the temperature in Paris right now?")], True,
                 tools=[WEATHER_TOOL, TIME_TOOL]),
            case("tools_multistep", [SYS, user("Weather and time in Paris?"),
                                     assistant("", reasoning_content="I need two tools.",
                                               tool_calls=[tool_call("get_current_temperature", WEATHER_ARGS),
                                                           tool_call("get_time", json.dumps(TIME_ARGS),
                                                                     "call67890")]),
                                     tool_msg("22.0"), tool_msg("12:00", "get_time", "call67890"),
                                     assistant("It is 22 °C and 12:00 in Paris.",
                                               reasoning_content="Both results are in.")], False,
                 tools=[WEATHER_TOOL, TIME_TOOL]),
            case("tool_response_as_user", [user("Weather?"),
                                           assistant("", tool_calls=[tool_call("get_current_temperature",
                                                                               WEATHER_ARGS)]),
                                           user("<tool_response>\n22.0\n</tool_response>")], True,
                 tools=[WEATHER_TOOL], enable_thinking=False),
        ]
    elif name == "gemma_it":
        c += generic_cases(name)
        c += [case("error_system", [SYS, U1], True)]
    elif name == "gemma3_it":
        c += generic_cases(name)
        c += [
            case("content_parts", [{"role": "user", "content": [
                {"type": "image"}, {"type": "text", "text": "  Describe this image.  "},
                {"type": "text", "text": "\nIn one line."}]}], True),
            case("system_parts", [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, U1], True),
            case("error_content_type", [{"role": "user", "content": 42}], True),
        ]
    elif name == "deepseek_r1":
        c += generic_cases(name)
        c += [
            case("think_stripped", [U2, assistant("<think>\n2 + 2 is 4.\n</think>\n\nThe answer is 4."),
                                    user("Thanks!")], True),
            case("two_system", [SYS, {"role": "system", "content": "Answer tersely."}, U1], True),
            case("tool_calls", [user("Weather and time in Paris?"),
                                assistant("", tool_calls=[
                                    tool_call("get_current_temperature", json.dumps(WEATHER_ARGS)),
                                    tool_call("get_time", json.dumps(TIME_ARGS), "call67890")]),
                                tool_msg("22.0"), tool_msg("12:00", "get_time", "call67890"),
                                assistant("It is 22 °C and 12:00 in Paris.")], False, tools=[WEATHER_TOOL]),
            case("tool_pending", [user("Weather?"),
                                  assistant("Checking.", tool_calls=[tool_call("get_current_temperature",
                                                                               json.dumps(WEATHER_ARGS))]),
                                  tool_msg("22.0")], True, tools=[WEATHER_TOOL]),
            case("error_tool_call_null_content", [user("Weather?"),
                                                  assistant(None, tool_calls=[tool_call(
                                                      "get_current_temperature", json.dumps(WEATHER_ARGS))])],
                 True, tools=[WEATHER_TOOL]),
        ]
    else:
        c += generic_cases(name)
    seen = set()
    for x in c:
        assert x["case"] not in seen, (name, x["case"])
        seen.add(x["case"])
    return c


# ---------------------------------------------------------------------------------------------------------------
# What transformers does around the template


def template_messages(messages):
    """The messages as transformers 5 hands them to the template (see the module docstring)."""
    out = []
    for m in messages:
        m = {k: copy.deepcopy(v) for k, v in m.items() if v is not None}
        r = next((m[k] for k in ("reasoning_content", "thinking", "reasoning") if m.get(k) is not None), None)
        if r is not None:
            m = {"thinking": r, **m, "reasoning_content": r}
        out.append(m)
    return out


def make_env(now):
    """The jinja2 environment of transformers 5 (utils/chat_template_utils.py), with strftime_now's clock at now."""
    import jinja2
    import jinja2.exceptions
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        # {% generation %}...{% endgeneration %}: renders its body (transformers also records where it went, for
        # return_assistant_tokens_mask)
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

        def _generation(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for n in attrs:
                TemplateNamespace._check_name(n)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, n, value):
            TemplateNamespace._check_name(n)
            jinja2.utils.Namespace.__setitem__(self, n, value)

        @staticmethod
        def _check_name(n):
            if isinstance(n, str) and n.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"underscore-prefixed namespace attribute {n!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


_COMPILED = {}


def render_direct(env, template, specials, c):
    variables = {**specials, **c["kwargs"]}
    key = (id(env), template)
    if key not in _COMPILED:
        _COMPILED[key] = (env, env.from_string(template))  # env kept alive so that its id stays unique
    try:
        out = _COMPILED[key][1].render(messages=template_messages(c["messages"]), tools=c["tools"],
                                               documents=None, add_generation_prompt=c["add_generation_prompt"],
                                               **variables)
        return {"expected": out}
    except Exception as e:  # noqa: BLE001 - recorded and compared
        return {"error": str(e), "error_type": type(e).__name__}


class fixed_clock:
    """Patches the datetime that transformers' strftime_now calls (a global of chat_template_utils)."""

    def __init__(self, now):
        self.now = now

    def __enter__(self):
        import transformers.utils.chat_template_utils as ctu
        now = self.now

        class FixedDatetime(_datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return now if tz is None else now.astimezone(tz)

        self.ctu, self.saved = ctu, ctu.datetime
        ctu.datetime = FixedDatetime
        return self

    def __exit__(self, *exc):
        self.ctu.datetime = self.saved
        return False


# ---------------------------------------------------------------------------------------------------------------
# make


def build_tokenizer(name):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    fam = FAMILIES[name]
    named = [fam[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in fam]
    specials = list(dict.fromkeys(named + fam.get("extra", [])))
    vocab = {}
    for t in specials + ["[UNK]"] + sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(t, len(vocab))
    # A byte-level BPE without merges: any text encodes (one token per byte), and the C++ reader takes it.
    tok = Tokenizer(models.BPE(vocab, merges=[], unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if fam.get("added"):
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in fam["added"]])
    return tok


def save_template_dir(root, name):
    import transformers

    fam = FAMILIES[name]
    kw = {k: fam.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    extra = [t for t in fam.get("extra", []) if t not in kw.values()]
    if extra:
        kw["additional_special_tokens"] = extra
    out = os.path.join(root, name)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(name), chat_template=TEMPLATES[name],
                                                **kw)
    layout = LAYOUT[name]
    fast.save_pretrained(out, save_jinja_files=(layout != "config"))
    cfg_path = os.path.join(out, "tokenizer_config.json")
    if layout == "both":
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
        cfg["chat_template"] = DECOY_TEMPLATE
        with open(cfg_path, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2, ensure_ascii=False)
            f.write("\n")
    bad = []
    has_jinja = os.path.exists(os.path.join(out, "chat_template.jinja"))
    with open(cfg_path, encoding="utf-8") as f:
        in_cfg = "chat_template" in json.load(f)
    if (has_jinja, in_cfg) != {"jinja": (True, False), "config": (False, True), "both": (True, True)}[layout]:
        bad.append(f"{name}: layout {layout}: chat_template.jinja {has_jinja}, in tokenizer_config.json {in_cfg}")
    if has_jinja:
        with open(os.path.join(out, "chat_template.jinja"), encoding="utf-8", newline="") as f:
            if f.read() != TEMPLATES[name]:
                bad.append(f"{name}: chat_template.jinja is not the template byte for byte")
    return out, bad


def make(root, names):
    import transformers

    os.makedirs(root, exist_ok=True)
    env_now, env_other = make_env(NOW), make_env(OTHER_NOW)
    bad, lines, manifest = [], [], {}
    ncases = nerr = 0
    with open(os.path.join(root, "cases.jsonl"), "w", encoding="utf-8") as out_f:
        for name in names:
            out, b = save_template_dir(root, name)
            bad += b
            tok = transformers.AutoTokenizer.from_pretrained(out)
            if tok.chat_template != TEMPLATES[name]:
                bad.append(f"{name}: the tokenizer loaded from {LAYOUT[name]} layout has another chat_template")
            specials = dict(tok.special_tokens_map)
            want = {k: FAMILIES[name][k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                    if k in FAMILIES[name]}
            if specials != want:
                bad.append(f"{name}: special_tokens_map {specials} != {want}")
            with open(os.path.join(out, "expected_specials.json"), "w", encoding="utf-8") as f:
                json.dump(specials, f, indent=1, ensure_ascii=False)
                f.write("\n")
            manifest[name] = {"layout": LAYOUT[name], "sha256": TEMPLATE_SHA256[name], "chars": len(TEMPLATES[name]),
                              "source": SOURCES[name], "special_tokens_map": specials}
            nraise = nnow = 0
            for c in cases_for(name):
                with fixed_clock(NOW):
                    try:
                        res = {"expected": tok.apply_chat_template(
                            copy.deepcopy(c["messages"]), tools=copy.deepcopy(c["tools"]),
                            add_generation_prompt=c["add_generation_prompt"], tokenize=False,
                            **copy.deepcopy(c["kwargs"]))}
                    except Exception as e:  # noqa: BLE001 - recorded and compared
                        res = {"error": str(e), "error_type": type(e).__name__}
                direct = render_direct(env_now, TEMPLATES[name], specials, c)
                if direct != res:
                    bad.append(f"{name}/{c['case']}: jinja2 direct {direct!r} != transformers {res!r}")
                other = render_direct(env_other, TEMPLATES[name], specials, c)
                depends = other != direct
                nnow += depends
                if "error" in res:
                    nraise += 1
                    if res["error_type"] != "TemplateError" and c["case"] != "error_tool_call_null_content":
                        bad.append(f"{name}/{c['case']}: unexpected {res['error_type']}: {res['error']}")
                elif c["case"].startswith("error_"):
                    bad.append(f"{name}/{c['case']}: expected an exception, rendered {res['expected']!r}")
                if "now" in c["case"] and not depends:
                    bad.append(f"{name}/{c['case']}: does not depend on strftime_now's clock")
                if "now" in c["case"] and NOW.strftime("%d %b %Y") not in res.get("expected", ""):
                    bad.append(f"{name}/{c['case']}: the fixed clock did not reach transformers' strftime_now")
                rec = {"template": name, "case": c["case"], "dir": out, "layout": LAYOUT[name],
                       "messages": c["messages"], "template_messages": template_messages(c["messages"]),
                       "add_generation_prompt": c["add_generation_prompt"], "tools": c["tools"],
                       "kwargs": c["kwargs"], "now": NOW.isoformat(), "depends_on_now": depends, **res}
                out_f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                ncases += 1
            nerr += nraise
            if name in TOOL_TEMPLATES and not any(c["tools"] for c in cases_for(name)):
                bad.append(f"{name}: no case passes tools")
            if name in MUST_RAISE and nraise == 0:
                bad.append(f"{name}: no case raised")
            lines.append(f"{name}: layout {LAYOUT[name]}, {len(cases_for(name))} cases, {nraise} raise, "
                         f"{nnow} depend on the clock, specials {specials}")
    with open(os.path.join(root, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return lines, bad, ncases, nerr


# ---------------------------------------------------------------------------------------------------------------
# constructs


# Environment options flipped by `constructs` to see which ones the output of the cases depends on.
ENV_FLIPS = (("trim_blocks", False), ("lstrip_blocks", False), ("keep_trailing_newline", True))

# What apply_chat_template always passes (besides the special tokens and the caller's kwargs).
CONTEXT_VARIABLES = ("messages", "tools", "documents", "add_generation_prompt")


def analyze(name, template):
    import jinja2
    import jinja2.meta
    import jinja2.nodes as N

    env = make_env(NOW)
    toks = list(env.lex(template))
    ast = env.parse(template)
    r = {k: set() for k in ("statements", "filters", "tests", "tests_by_name", "methods", "functions", "loop",
                            "attributes", "subscripts", "operators", "expressions", "literals", "whitespace",
                            "string_escapes", "context_variables")}
    for _, kind, value in toks:
        if kind in ("block_begin", "block_end", "variable_begin", "variable_end", "comment_begin", "comment_end"):
            value = value.strip()  # the lexer keeps the whitespace that "-%}" / "-}}" eat
            if "-" in value or "+" in value:
                r["whitespace"].add(value)
        if kind == "comment_begin":
            r["statements"].add("comment {# #}")
        if kind == "string":
            r["literals"].add("string " + ("'...'" if value[0] == "'" else '"..."'))
            i = 1
            while i < len(value) - 1:
                if value[i] == "\\":
                    r["string_escapes"].add(value[i:i + 2])
                    i += 2
                else:
                    i += 1
    binops = {N.Add: "+", N.Sub: "-", N.Mul: "*", N.Div: "/", N.FloorDiv: "//", N.Mod: "%", N.Pow: "**",
              N.Concat: "~", N.And: "and", N.Or: "or"}
    cmpops = {"eq": "==", "ne": "!=", "lt": "<", "lteq": "<=", "gt": ">", "gteq": ">=", "in": "in",
              "notin": "not in"}
    called = set()
    for node in ast.find_all(N.Call):
        called.add(id(node.node))
    for node in ast.find_all(N.Node):
        t = type(node)
        if t is N.For:
            r["statements"].add("for")
            if node.test is not None:
                r["statements"].add("for ... if (loop filter)")
            if node.else_:
                r["statements"].add("for-else")
            if node.recursive:
                r["statements"].add("for recursive")
            if isinstance(node.target, N.Tuple):
                r["statements"].add("for a, b in (unpacking)")
        elif t is N.If:
            r["statements"].add("if")
            if node.elif_:
                r["statements"].add("elif")
            if node.else_:
                r["statements"].add("else")
        elif t is N.Assign:
            if isinstance(node.target, N.NSRef):
                r["statements"].add("set ns.attr")
            elif isinstance(node.target, N.Tuple):
                r["statements"].add("set a, b")
            else:
                r["statements"].add("set")
        elif t is N.AssignBlock:
            r["statements"].add("set-block")
        elif t is N.Macro:
            r["statements"].add("macro")
        elif t is N.CallBlock:
            is_gen = isinstance(node.call, N.Call) and isinstance(node.call.node, N.ExtensionAttribute)
            r["statements"].add("generation" if is_gen else "call")
        elif t is N.FilterBlock:
            r["statements"].add("filter-block")
        elif t in (N.Break, N.Continue):
            r["statements"].add(t.__name__.lower())
        elif t in (N.With, N.Scope, N.Include, N.Import, N.FromImport, N.Extends, N.Block):
            r["statements"].add(t.__name__.lower())
        elif t is N.Output:
            if any(isinstance(x, N.TemplateData) for x in node.nodes):
                r["statements"].add("raw text")
            if any(not isinstance(x, N.TemplateData) for x in node.nodes):
                r["statements"].add("{{ expression }}")
        elif t is N.Filter and node.name is not None:
            kws = ",".join(sorted(k.key + "=" for k in node.kwargs))
            r["filters"].add(node.name + (f"({kws})" if kws else ""))
            if node.name in ("select", "reject", "selectattr", "rejectattr"):
                i = 1 if node.name.endswith("attr") else 0
                if len(node.args) > i and isinstance(node.args[i], N.Const):
                    r["tests_by_name"].add(f"{node.args[i].value} (via {node.name})")
        elif t is N.Test:
            r["tests"].add(node.name)
        elif t is N.Not:
            if isinstance(node.node, N.Test):
                r["tests"].add("is not " + node.node.name)
            else:
                r["operators"].add("not")
        elif t is N.Neg:
            r["operators"].add("unary -")
        elif t in binops:
            r["operators"].add(binops[t])
        elif t is N.Compare:
            for op in node.ops:
                r["operators"].add(cmpops.get(op.op, op.op))
        elif t is N.CondExpr:
            r["expressions"].add("x if c else y" if node.expr2 is not None else "x if c (no else)")
        elif t is N.Call:
            if isinstance(node.node, N.Getattr):
                r["methods"].add("." + node.node.attr + "()")
            elif isinstance(node.node, N.Name):
                r["functions"].add(node.node.name + "()")
            if node.kwargs:
                r["expressions"].add("call with keyword arguments")
        elif t is N.Getattr:
            if isinstance(node.node, N.Name) and node.node.name == "loop":
                r["loop"].add("loop." + node.attr)
            elif id(node) not in called:
                r["attributes"].add("." + node.attr)
        elif t is N.Getitem:
            a = node.arg
            if isinstance(a, N.Slice):
                def part(x):
                    if x is None:
                        return ""
                    if isinstance(x, N.Const):
                        return repr(x.value)
                    if isinstance(x, N.Neg) and isinstance(x.node, N.Const):
                        return "-" + repr(x.node.value)
                    return "expr"
                s = f"[{part(a.start)}:{part(a.stop)}" + (f":{part(a.step)}]" if a.step is not None else "]")
                r["subscripts"].add("slice " + s)
            elif isinstance(a, N.Const):
                r["subscripts"].add("[str]" if isinstance(a.value, str) else f"[{a.value!r}]")
            elif isinstance(a, N.Neg) and isinstance(a.node, N.Const):
                r["subscripts"].add(f"[-{a.node.value!r}]")
            else:
                r["subscripts"].add("[expression]")
        elif t is N.List:
            r["literals"].add("list [...]")
        elif t is N.Dict:
            r["literals"].add("dict {...}")
        elif t is N.Tuple and node.ctx == "load":
            r["literals"].add("tuple (...)")
        elif t is N.Const:
            v = node.value
            kind = {bool: "bool", int: "int", float: "float", type(None): "none"}.get(type(v))
            if kind:
                r["literals"].add(kind)
    # Context variables the template reads: the ones jinja2.meta reports as undeclared, less those the template only
    # sets itself, plus those it sets but also reads from the context first ("if not x is defined ... set x").
    assigned = {n.name for a in ast.find_all((N.Assign, N.For)) for n in a.target.find_all(N.Name)} | \
               {n.name for n in ast.find_all(N.Name) if n.ctx == "store"}
    probed = {t.node.name for t in ast.find_all(N.Test)
              if t.name in ("defined", "undefined") and isinstance(t.node, N.Name)}
    undeclared = set(jinja2.meta.find_undeclared_variables(ast))
    r["context_variables"] = {v for v in undeclared if v not in assigned or v in probed or v in CONTEXT_VARIABLES}
    # Which of transformers' environment options change the output of some case of this template?
    specials = {k: FAMILIES[name][k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                if k in FAMILIES[name]}
    base = [render_direct(env, template, specials, c) for c in cases_for(name)]
    r["environment_sensitivity"] = set()
    for opt, value in ENV_FLIPS:
        other = make_env(NOW)
        setattr(other, opt, value)
        n = sum(render_direct(other, template, specials, c) != b for c, b in zip(cases_for(name), base))
        r["environment_sensitivity"].add(f"{opt}={value} changes {n} of {len(base)} cases")
    r["expressions"].add("template ends with a newline" if template.endswith("\n") else "no trailing newline")
    return {k: sorted(v) for k, v in r.items()}


def constructs(names, as_json):
    res = {name: analyze(name, TEMPLATES[name]) for name in names}
    union = {}
    for v in res.values():
        for k, items in v.items():
            union.setdefault(k, set()).update(items)
    union = {k: sorted(v) for k, v in union.items()}
    totals = []
    for opt, value in ENV_FLIPS:
        prefix = f"{opt}={value} changes "
        per = [x for v in res.values() for x in v["environment_sensitivity"] if x.startswith(prefix)]
        changed = [int(x[len(prefix):].split()[0]) for x in per]
        totals.append(f"{prefix}{sum(changed)} cases in {sum(1 for n in changed if n)} of {len(per)} templates")
    union["environment_sensitivity"] = totals
    if as_json:
        print(json.dumps({"templates": res, "union": union}, indent=1, ensure_ascii=False))
        return
    for name, v in list(res.items()) + [("UNION", union)]:
        print(f"{name}:")
        for k, items in v.items():
            if items:
                print(f"  {k}: {'  '.join(items)}")


# ---------------------------------------------------------------------------------------------------------------


def check_templates(names):
    bad = []
    for name in names:
        got = hashlib.sha256(TEMPLATES[name].encode("utf-8")).hexdigest()
        if got != TEMPLATE_SHA256[name]:
            bad.append(f"{name}: template text changed (sha256 {got} != {TEMPLATE_SHA256[name]}); "
                       "an editor may have touched tabs, trailing spaces or line ends")
    return bad


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["make", "constructs", "list"])
    p.add_argument("paths", nargs="*", help="make: ROOT")
    p.add_argument("--templates", default=None, help="comma list; default: all")
    p.add_argument("--json", action="store_true", help="constructs: print JSON")
    a = p.parse_args()
    names = a.templates.split(",") if a.templates else list(TEMPLATES)
    unknown = [n for n in names if n not in TEMPLATES]
    if unknown:
        p.error(f"unknown templates {unknown}; known: {', '.join(TEMPLATES)}")
    bad = check_templates(names)
    if bad:
        print("\n".join(bad))
        return 1
    if a.mode == "list":
        for n in names:
            print(f"{n} {LAYOUT[n]} {TEMPLATE_SHA256[n]} {SOURCES[n]}")
        return 0
    if a.mode == "constructs":
        constructs(names, a.json)
        return 0
    if len(a.paths) != 1:
        p.error("make needs ROOT")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers
    transformers.utils.logging.set_verbosity_error()
    t0 = time.perf_counter()
    lines, bad, ncases, nerr = make(a.paths[0], names)
    for line in lines:
        print(line, flush=True)
    for b in bad:
        print(b)
    print(f"made {len(names)} templates, {ncases} cases ({nerr} raise) in {time.perf_counter() - t0:.1f} s"
          f"{', MISMATCHES' if bad else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
