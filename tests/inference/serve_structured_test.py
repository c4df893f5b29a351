"""serve's structured output through the `openai` client at TP 2 on a tiny real checkpoint (serve_fixture.py):
response_format json_schema / json_object and tool_choice "required" / a named function.

    python tests/inference/serve_structured_test.py <build/bin>

Checked:
  - greedy under an enum schema equals transformers' greedy generate constrained to the same strings
    (prefix_allowed_tokens_fn over the byte-level vocabulary): the mask, the end-of-sequence rule and the stop;
  - four bounded schemas (every string, array and number bounded, so every choice must end "stop"), n=3 sampled
    choices and a greedy one each: every text is JSON that the `jsonschema` package validates against the schema;
  - ignore_eos with a schema: the end-of-sequence token still ends each choice ("stop"), the text valid JSON;
  - json_object: every choice that ends "stop" is a JSON object; a streamed choice equals the plain one (same seed);
    the completions endpoint takes response_format too;
  - tool_choice "required" and a named function: message.tool_calls, finish_reason "tool_calls", the arguments valid
    against the function's parameters (and the function among the tools);
  - refusals, 400 naming the field: an unsupported keyword (named), an unknown type, a function not among the tools,
    response_format with a forcing tool_choice.
Exit 1 on a failure; one line per check, then a `summary` line.
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_fixture import MIN_GAP, Checks, WORDS, Server, make_checkpoint  # noqa: E402

check = Checks()

ENUM = ["red", "green", "dark blue", "東京", "🙂 smile", "greenish"]
SCHEMAS = {
    "person": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}, "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}},
        "required": ["name", "age", "ok", "color"]},
    "optional": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 4},
                                                  "c": {"type": "null"}}, "additionalProperties": False},
    "any_of": {"anyOf": [{"type": "string", "maxLength": 3}, {"type": ["number", "null"]},
                         {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3}]},
    "order": {"type": "object", "$defs": {"Item": {"type": "object", "properties": {
        "sku": {"type": "string", "maxLength": 4}, "qty": {"type": "integer", "default": 1}}, "required": ["sku"]}},
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}, "maxItems": 2},
                       "note": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]}},
        "required": ["items"], "title": "Order"},
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                              "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
             "required": ["x", "y"]}}}]


def gpt2_bytes_to_unicode():
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for code points 256, 257, ..."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    return dict(zip(bs, map(chr, cs)))


def hf_constrained_greedy(model_dir, tok, prompt_ids, strings, max_new_tokens):
    """transformers' greedy generate, each step limited to the tokens that keep the text a prefix of one of
    `strings` (their JSON text), the end-of-sequence token once the text is one of them."""
    import torch
    from transformers import AutoModelForCausalLM
    decoder = {u: b for b, u in gpt2_bytes_to_unicode().items()}
    specials = set(tok.all_special_ids)
    vocab = {}
    for i, t in enumerate(tok.convert_ids_to_tokens(list(range(len(tok))))):
        if i not in specials and t is not None and all(ch in decoder for ch in t):
            vocab[i] = bytes(decoder[ch] for ch in t)
    targets = [json.dumps(s, ensure_ascii=False).encode() for s in strings]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    n = len(prompt_ids)

    def allowed(_, ids):
        text = b"".join(vocab[i] for i in ids[n:].tolist())
        out = [i for i, b in vocab.items() if b and any(t.startswith(text + b) for t in targets)]
        return out + ([tok.eos_token_id] if text in targets else [])
    x = torch.tensor([prompt_ids])
    with torch.no_grad():
        r = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                           prefix_allowed_tokens_fn=allowed, pad_token_id=0, eos_token_id=tok.eos_token_id,
                           output_scores=True, return_dict_in_generate=True)
    # The smallest gap between the two best allowed tokens of a step (inf where one alone was allowed): a clear top-1
    # makes the comparison independent of rounding (TP 2 sums in another order).
    gaps = [float(v[0] - v[1]) for v in (s[0].topk(2).values for s in r.scores)]
    return tok.decode(r.sequences[0, n:], skip_special_tokens=True), min(gaps)


def bad_request(fn):
    import openai
    try:
        fn()
        return None, ""
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        return body.get("param"), body.get("message", "")


def main():
    bin_dir = sys.argv[1]
    import jsonschema
    import openai
    root = tempfile.mkdtemp(prefix="serve_structured_")
    model_dir, tok, _ = make_checkpoint(root, WORDS[:2], 2, clear_top1=False)
    name = os.path.basename(model_dir)
    messages = [{"role": "user", "content": "Answer in JSON."}]
    server = Server(bin_dir, model_dir, tp=2)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)

        # The oracle: transformers' constrained greedy on the same prompts.
        for question in ["Answer in JSON.", "Pick a colour:", "東京 or 🙂?", "Greenish, or green?"]:
            msgs = [{"role": "user", "content": question}]
            prompt_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            if hasattr(prompt_ids, "keys"):
                prompt_ids = prompt_ids["input_ids"]
            want, gap = hf_constrained_greedy(model_dir, tok, prompt_ids, ENUM, 16)
            r = client.chat.completions.create(model=name, messages=msgs, temperature=0, max_tokens=16,
                                               response_format={"type": "json_schema", "json_schema": {
                                                   "name": "color", "schema": {"enum": ENUM}}})
            got = r.choices[0].message.content
            check(gap > MIN_GAP and got == want and r.choices[0].finish_reason == "stop" and json.loads(got) in ENUM,
                  f"enum schema, greedy on {question!r}: {got} equals transformers' constrained greedy (top-1 gaps "
                  f">= {gap:.3f})", (got, want, r.choices[0].finish_reason, gap))

        # Bounded schemas: every choice ends "stop" with JSON the schema validates.
        for label, schema in SCHEMAS.items():
            fmt = {"type": "json_schema", "json_schema": {"name": label, "schema": schema, "strict": True}}
            texts = []
            for kwargs in ({"temperature": 0, "n": 1}, {"temperature": 1.0, "n": 3, "seed": 7}):
                r = client.chat.completions.create(model=name, messages=messages, max_tokens=1500, response_format=fmt,
                                                   **kwargs)
                texts += [(c.message.content, c.finish_reason) for c in r.choices]
            problems = []
            for text, reason in texts:
                try:
                    if reason != "stop":
                        raise ValueError(f"finish_reason {reason}")
                    jsonschema.Draft202012Validator(schema).validate(json.loads(text))
                except Exception as e:  # noqa: BLE001
                    problems.append((text, str(e)[:200]))
            check(not problems, f"json_schema '{label}': {len(texts)} choices (greedy, 3 sampled) end 'stop' and validate",
                  problems)

        # ignore_eos under a grammar: the end-of-sequence token (allowed once the text is complete, here made certain
        # by a logit bias) ends the choice, never kept as text with the grammar going on.
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=8, temperature=0,
                                           logit_bias={str(tok.eos_token_id): 100},
                                           response_format={"type": "json_schema", "json_schema": {
                                               "name": "n", "schema": {"type": "integer"}}},
                                           extra_body={"ignore_eos": True})
        c = r.choices[0]
        check(c.finish_reason == "stop" and isinstance(json.loads(c.message.content), int),
              "ignore_eos with a schema: the end-of-sequence token still ends the choice ('stop', an integer)",
              (c.message.content, c.finish_reason))

        # json_object: a dict when it ends; streamed equals plain; completions take response_format.
        fmt = {"type": "json_object"}
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=64, temperature=1.0, n=4, seed=3,
                                           response_format=fmt)
        ends = [c.message.content for c in r.choices if c.finish_reason == "stop"]
        check(all(isinstance(json.loads(t), dict) for t in ends) and all(c.message.content.startswith("{") for c in r.choices),
              f"json_object: every choice starts an object, the {len(ends)} of 4 that end are JSON objects",
              [c.message.content for c in r.choices])
        plain = client.chat.completions.create(model=name, messages=messages, max_tokens=64, temperature=1.0, seed=5,
                                               response_format=fmt).choices[0].message.content
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=name, messages=messages, max_tokens=64, temperature=1.0, seed=5, response_format=fmt, stream=True)
            if c.choices)
        check(streamed == plain, "json_object: the streamed choice equals the plain one (same seed)", (streamed, plain))
        r = client.completions.create(model=name, prompt="JSON:", max_tokens=300, temperature=0,
                                      extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                          "name": "p", "schema": SCHEMAS["person"]}}})
        ok = r.choices[0].finish_reason == "stop"
        if ok:
            jsonschema.validate(json.loads(r.choices[0].text), SCHEMAS["person"])
        check(ok, "completions with response_format json_schema: the text validates", r.choices[0].text)

        # Forced tool calls.
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=1500, temperature=1.0, n=2, seed=1,
                                           tools=TOOLS, tool_choice="required")
        problems = []
        for c in r.choices:
            try:
                assert c.finish_reason == "tool_calls" and c.message.tool_calls, (c.finish_reason, c.message.content)
                for call in c.message.tool_calls:
                    fn = next(t["function"] for t in TOOLS if t["function"]["name"] == call.function.name)
                    jsonschema.validate(json.loads(call.function.arguments), fn["parameters"])
            except Exception as e:  # noqa: BLE001
                problems.append(str(e)[:300])
        check(not problems, "tool_choice required: 2 choices of tool_calls, each a listed function with valid arguments",
              problems)
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=1500, temperature=0, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "add"}})
        c = r.choices[0]
        calls = c.message.tool_calls or []
        ok = c.finish_reason == "tool_calls" and len(calls) == 1 and calls[0].function.name == "add"
        if ok:
            jsonschema.validate(json.loads(calls[0].function.arguments), TOOLS[1]["function"]["parameters"])
        check(ok, "tool_choice naming 'add': one call of add with valid arguments", c)

        # Refusals.
        def ask(**kw):
            return lambda: client.chat.completions.create(model=name, messages=messages, max_tokens=4, **kw)
        for label, fn, param, words in [
                ("a pattern keyword", ask(response_format={"type": "json_schema", "json_schema": {
                    "name": "x", "schema": {"type": "string", "pattern": "a+"}}}), "response_format", "'pattern'"),
                ("an unknown type", ask(response_format={"type": "yaml"}), "response_format", "yaml"),
                ("a function not among the tools", ask(tools=TOOLS, tool_choice={"type": "function", "function": {
                    "name": "nope"}}), "tool_choice", "'nope'"),
                ("response_format with tool_choice required", ask(tools=TOOLS, tool_choice="required",
                                                                  response_format={"type": "json_object"}),
                 "tool_choice", "both constrain"),
                ("a tool whose parameters use minimum", ask(tools=[{"type": "function", "function": {
                    "name": "f", "parameters": {"type": "integer", "minimum": 0}}}], tool_choice="required"),
                 "tools", "'minimum'")]:
            got_param, message = bad_request(fn)
            check(got_param == param and words in message, f"400 naming {param} for {label}", (got_param, message))
        r = client.chat.completions.create(model=name, messages=messages, max_tokens=3, temperature=0)
        check(r.choices[0].finish_reason in ("stop", "length"), "the server still serves after the refusals")
    finally:
        server.stop()
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
