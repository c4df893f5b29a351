"""serve's tools: the tools reach the chat template as transformers renders them, tool_choice's rules, and the
responses' shapes, through the `openai` client at TP 2 on a tiny real checkpoint with Qwen2.5's chat template
(serve_fixture.py). Parsing the calls back is checked in C++ (ServeToolParsers: the hermes, llama3_json and mistral
formats); a random model never writes one, so here the text stays content.

    python tests/inference/serve_tools_test.py <build/bin>

Checked:
  - a request with tools (and a conversation with an assistant's tool call and the tool's answer) is prompted with
    exactly transformers' apply_chat_template(messages, tools=..., add_generation_prompt=True) tokens (usage's
    prompt_tokens and the greedy text equal a plain request with that prompt);
  - tool_choice "auto" without --enable-auto-tool-choice: 400 naming tool_choice, as an unknown tool_choice; malformed
    tools: 400 naming tools ("required" and a named function: serve_structured_test.py);
  - with --enable-auto-tool-choice --tool-call-parser hermes: plain text comes back as content with finish_reason
    "stop"/"length", plain and streamed (the streamed text sent whole when the choice ends);
Exit 1 on a failure; one line per check, then a `summary` line.
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_fixture import Checks, WORDS, Server, make_checkpoint  # noqa: E402


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
            {"role": "user", "content": "And tomorrow?"}]


check = Checks()


def bad_param(fn):
    import openai
    try:
        fn()
        return None
    except openai.BadRequestError as e:
        return e.body.get("param") if isinstance(e.body, dict) else "?"


def main():
    bin_dir = sys.argv[1]
    import openai
    root = tempfile.mkdtemp(prefix="serve_tools_")
    model_dir, tok, _ = make_checkpoint(root, WORDS[:2], 2, clear_top1=False)
    name = os.path.basename(model_dir)
    # transformers' rendering: the tools and the tool-call turns (Qwen2.5's template).
    hf_ids = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=True)
    if hasattr(hf_ids, "keys"):  # a BatchEncoding in newer transformers
        hf_ids = hf_ids["input_ids"]
    if hf_ids and isinstance(hf_ids[0], list):
        hf_ids = hf_ids[0]
    hf_ids = [int(t) for t in hf_ids]
    server = Server(bin_dir, model_dir, tp=2)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)
        r = client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=6,
                                           temperature=0)
        plain = client.completions.create(model=name, prompt=hf_ids, max_tokens=6, temperature=0)
        check(r.usage.prompt_tokens == len(hf_ids) and r.choices[0].message.content == plain.choices[0].text,
              f"tools and tool-call turns are prompted as transformers' apply_chat_template ({len(hf_ids)} tokens)",
              (r.usage.prompt_tokens, len(hf_ids), r.choices[0].message.content, plain.choices[0].text))
        kw = dict(model=name, messages=MESSAGES, max_tokens=2)
        check(bad_param(lambda: client.chat.completions.create(tools=TOOLS, **kw)) == "tool_choice",
              "tool_choice \"auto\" (the default with tools) without --enable-auto-tool-choice: 400")
        check(bad_param(lambda: client.chat.completions.create(tools=TOOLS, tool_choice="anything", **kw)) == "tool_choice",
              "an unknown tool_choice: 400")
        check(bad_param(lambda: client.chat.completions.create(tools=[{"type": "function"}], tool_choice="none", **kw))
              == "tools", "a malformed tool: 400 naming tools")
    finally:
        server.stop()

    server = Server(bin_dir, model_dir, tp=2, args=["--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)
        r = client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, max_tokens=6, temperature=0)
        m = r.choices[0]
        plain = client.completions.create(model=name, prompt=hf_ids, max_tokens=6, temperature=0).choices[0].text
        check(m.message.tool_calls is None and m.message.content == plain.strip() and m.finish_reason in ("stop", "length"),
              "tool_choice auto with the hermes parser: text without a call is the content", m)
        chunks = list(client.chat.completions.create(model=name, messages=MESSAGES, tools=TOOLS, max_tokens=6,
                                                     temperature=0, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        ends = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        check(text == m.message.content and ends == [m.finish_reason],
              "streamed with tools: the choice's content sent whole when it ends, one finish_reason", (text, ends))
    finally:
        server.stop()
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
