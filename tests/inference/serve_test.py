"""serve against real clients: the `openai` Python package and curl, at TP 2, on a tiny real checkpoint saved by
transformers (serve_fixture.py), with transformers' greedy generate as the oracle.

    python tests/inference/serve_test.py <build/bin>

Checks:
  - bad flags (no weights, a bad port, a tokenizer larger than the model's vocabulary, too few KV blocks, ...): one
    `error:` line on rank 0 and exit 2 on every rank;
  - 16 concurrent clients (openai package, /v1/completions, temperature 0): each text is transformers'
    decode(generate(prompt)) and usage counts its tokens; the same 16 streamed: the streamed pieces add up to the
    non-streamed text; chat completions (the tokenizer's chat template), streamed and not, agree too;
  - curl, plain and streamed (SSE `data:` lines, then `data: [DONE]`);
  - seeded sampling repeats itself; a stop string ends the text before it (finish_reason "stop");
  - bad input gets HTTP 400 with an OpenAI error body naming the field: malformed JSON, an unknown field, a prompt
    longer than the context, max_tokens 0, a negative temperature; a wrong model 404; the server stays up;
  - /v1/models, /health, /metrics (requests, tokens, latency histograms, queue, KV-cache blocks);
  - a client that disconnects mid-stream frees its slot (running requests and KV blocks back to 0);
  - prefill in chunks and preemption (a server with a small token budget and few KV blocks) give the same texts;
  - a rank killed mid-stream: the stream ends with a 503 error, the server exits non-zero with an `error:` line;
  - prefix caching: 16 requests sharing a long system prompt give the texts of a server without it, and /metrics
    counts the shared blocks' tokens as hits;
  - speculative decoding by prompt lookup (--speculative-config ngram): the 16 greedy texts are transformers' still,
    with draft tokens scored and some accepted.
Every wait is bounded. Exit 1 on a failure; one line per check, then a `summary` line.
"""
import concurrent.futures
import http.client as httpclient
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_fixture import Checks, WORDS, Server, make_checkpoint  # noqa: E402

NEW = 12


check = Checks()


def http(url, body=None, method=None, timeout=60):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def curl(args, timeout=60):
    return subprocess.run(["curl", "-sS", "--max-time", str(timeout), *args], capture_output=True, text=True,
                          timeout=timeout + 10)


def open_stream(url, body):
    """A streamed completion, started: (connection, response, its first SSE line). The request is running."""
    host, port = url[len("http://"):].split(":")
    conn = httpclient.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    return conn, resp, resp.readline()


def metric(url, name):
    _, text = http(url + "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def main():
    bin_dir = sys.argv[1]
    import openai
    root = tempfile.mkdtemp(prefix="serve_test_")
    model_dir, tok, hf_new = make_checkpoint(root, WORDS, NEW)
    want = [tok.decode(n, skip_special_tokens=True) for n in hf_new]
    name = os.path.basename(model_dir)

    # Bad flags: one `error:` line on rank 0 and exit 2 on every rank, before any communication.
    import shutil
    small = os.path.join(root, "small_vocab")
    shutil.copytree(model_dir, small)
    with open(os.path.join(small, "config.json")) as f:
        cfg = json.load(f)
    cfg["vocab_size"] = 100
    with open(os.path.join(small, "config.json"), "w") as f:
        json.dump(cfg, f)
    bad_flags = [[], ["--hf-dir", model_dir, "--port", "70000"], ["--hf-dir", model_dir, "--checkpoint", root],
                 ["--checkpoint", root], ["--hf-dir", small], ["--hf-dir", model_dir, "--num-blocks", "3"],
                 ["--hf-dir", model_dir, "--max-model-len", "4096"], ["--hf-dir", model_dir, "--bogus"],
                 ["--hf-dir", model_dir, "--max-model-len", "64", "--kv-cache-space", "0.000001"]]
    for flags in bad_flags:
        outs = [subprocess.run([os.path.join(bin_dir, "serve"), *flags], env=dict(os.environ, RANK=str(r), WORLD_SIZE="2"),
                               capture_output=True, text=True, timeout=60) for r in (0, 1)]
        lines = (outs[0].stdout + outs[0].stderr).strip().splitlines()
        check(all(o.returncode == 2 for o in outs) and len(lines) == 1 and lines[0].startswith("error: ")
              and not (outs[1].stdout + outs[1].stderr).strip(), f"bad flags {flags[-2:]}: exit 2, one error line",
              (outs[0].returncode, outs[1].returncode, lines))

    server = Server(bin_dir, model_dir, tp=2)
    url = server.url
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=120, max_retries=0)

        def complete(i, stream=False):
            if not stream:
                r = client.completions.create(model=name, prompt=WORDS[i], max_tokens=NEW, temperature=0)
                return r.choices[0].text, r.usage.completion_tokens, r.choices[0].finish_reason
            text, reason = "", None
            for chunk in client.completions.create(model=name, prompt=WORDS[i], max_tokens=NEW, temperature=0, stream=True):
                text += chunk.choices[0].text
                reason = chunk.choices[0].finish_reason or reason
            return text, None, reason

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            plain = list(pool.map(lambda i: complete(i), range(16)))
            streamed = list(pool.map(lambda i: complete(i, True), range(16)))
        bad = [(i, plain[i][0], want[i]) for i in range(16) if plain[i][0] != want[i] or plain[i][1] != len(hf_new[i])]
        check(not bad, "16 concurrent openai clients: greedy texts equal transformers' generate", bad)
        bad = [(i, streamed[i], plain[i]) for i in range(16) if streamed[i][0] != plain[i][0] or streamed[i][2] != plain[i][2]]
        check(not bad, "16 concurrent streams equal the non-streamed texts", bad)

        # Chat: the template's prompt; streamed and not agree (the model is random: no oracle text beyond that).
        msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Wie geht's?"}]
        r = client.chat.completions.create(model=name, messages=msgs, max_tokens=NEW, temperature=0)
        chat_text = r.choices[0].message.content
        hf_chat_ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(hf_chat_ids, dict) or hasattr(hf_chat_ids, "keys"):
            hf_chat_ids = hf_chat_ids["input_ids"]
        stream_text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=name, messages=msgs, max_tokens=NEW, temperature=0, stream=True) if c.choices)
        check(r.usage.prompt_tokens == len(hf_chat_ids) and r.choices[0].message.role == "assistant"
              and stream_text == chat_text, "chat completions: template prompt tokens, streamed == not",
              (r.usage.prompt_tokens, len(hf_chat_ids), chat_text, stream_text))

        # curl, plain and streamed.
        body = json.dumps({"model": name, "prompt": WORDS[3], "max_tokens": NEW, "temperature": 0})
        c = curl(["-H", "Content-Type: application/json", "-d", body, url + "/v1/completions"])
        got = json.loads(c.stdout)["choices"][0]["text"] if c.returncode == 0 else None
        check(got == want[3], "curl /v1/completions", (c.stdout, c.stderr, want[3]))
        body = json.dumps({"model": name, "prompt": WORDS[3], "max_tokens": NEW, "temperature": 0, "stream": True,
                           "stream_options": {"include_usage": True}})
        c = curl(["-N", "-H", "Content-Type: application/json", "-d", body, url + "/v1/completions"])
        datas = [l[len("data: "):] for l in c.stdout.splitlines() if l.startswith("data: ")]
        pieces = [json.loads(d) for d in datas[:-1]]
        text = "".join(p["choices"][0]["text"] for p in pieces if p["choices"])
        usage = [p["usage"] for p in pieces if p.get("usage")]
        check(datas and datas[-1] == "[DONE]" and text == want[3] and usage and usage[0]["completion_tokens"] == len(hf_new[3]),
              "curl -N streamed SSE ends with [DONE], usage chunk, same text", c.stdout[-800:])

        # Seeded sampling repeats; a stop string cuts the text.
        samp = lambda: client.completions.create(model=name, prompt=WORDS[5], max_tokens=NEW, temperature=0.9, top_p=0.9,
                                                 seed=7, extra_body={"top_k": 20}).choices[0].text
        a, b = samp(), samp()
        check(a == b, "seeded sampling gives the same text twice", (a, b))
        stop = want[0][len(want[0]) // 2:len(want[0]) // 2 + 2]
        r = client.completions.create(model=name, prompt=WORDS[0], max_tokens=NEW, temperature=0, stop=[stop])
        check(r.choices[0].text == want[0][:want[0].find(stop)] and r.choices[0].finish_reason == "stop",
              f"stop string {stop!r} ends the text before it", (r.choices[0].text, want[0]))
        r2 = "".join(c.choices[0].text for c in client.completions.create(model=name, prompt=WORDS[0], max_tokens=NEW,
                                                                           temperature=0, stop=[stop], stream=True))
        check(r2 == r.choices[0].text, "streamed text with a stop string equals the non-streamed one", (r2, r.choices[0].text))

        # Bad input: 400 (404 for another model) with OpenAI's error body; the server stays up.
        cases = [("malformed JSON", b"{\"prompt\": ", 400, None),
                 ("unknown field", {"prompt": "x", "max_tokenz": 3}, 400, "max_tokenz"),
                 ("prompt longer than the context", {"prompt": "a " * 3000, "max_tokens": 4}, 400, "prompt"),
                 ("max_tokens 0", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
                 ("negative temperature", {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
                 ("n 65", {"prompt": "x", "n": 65}, 400, "n"),
                 ("token id outside the vocabulary", {"prompt": [1, 10 ** 9]}, 400, "prompt"),
                 ("chat without messages", {"model": name}, 400, "messages"),
                 ("another model", {"model": "gpt-9", "prompt": "x"}, 404, "model")]
        for label, body, status, param in cases:
            path = "/v1/chat/completions" if label.startswith("chat") else "/v1/completions"
            code, text = http(url + path, body)
            try:
                err = json.loads(text)["error"]
                ok = code == status and err["message"] and err["type"] and err["param"] == param
            except Exception:  # noqa: BLE001
                ok = False
            check(ok, f"{label}: HTTP {status}, OpenAI error body", (code, text))
        try:
            client.completions.create(model=name, prompt="x", max_tokens=0)
            check(False, "openai package raises BadRequestError on max_tokens 0")
        except openai.BadRequestError:
            check(True, "openai package raises BadRequestError on max_tokens 0")

        code, health = http(url + "/health")
        code_m, models = http(url + "/v1/models")
        check(code == 200 and code_m == 200 and json.loads(models)["data"][0]["id"] == name, "/health and /v1/models",
              (code, health, models))
        _, met = http(url + "/metrics")
        need = ["serve_requests_total{endpoint=\"/v1/completions\",status=\"200\"}",
                "serve_requests_total{endpoint=\"/v1/completions\",status=\"400\"}", "serve_generation_tokens_total",
                "serve_request_latency_seconds_bucket", "serve_time_to_first_token_seconds_count", "serve_queue_length",
                "serve_kv_cache_blocks_used", "serve_kv_cache_usage_ratio"]
        check(all(n in met for n in need), "/metrics has requests, tokens, latency histograms, queue, KV cache",
              [n for n in need if n not in met])

        # A streaming client that disconnects frees its slot.
        conn, _, _ = open_stream(url, {"model": name, "prompt": WORDS[1], "max_tokens": 1500, "ignore_eos": True})
        running_during = metric(url, "serve_running_requests")
        conn.sock.close()
        conn.close()
        deadline, freed = time.time() + 20, False
        while time.time() < deadline and not freed:
            freed = metric(url, "serve_running_requests") == 0 and metric(url, "serve_kv_cache_blocks_used") == 0
            time.sleep(0.1)
        _, met = http(url + "/metrics")
        check(running_during == 1 and freed and "status=\"499\"} 1" in met,
              "a client that disconnects mid-stream frees its slot and KV blocks", (running_during, freed))
    finally:
        rc = server.stop()
    # tprun exits 130 after forwarding SIGINT; rank 0 ends with its summary and no error.
    check(any(l.startswith("[rank0]: summary ") and "failed=0" in l for l in server.lines)
          and not any("error:" in l for l in server.err_lines), "SIGINT: rank 0 stops cleanly with a summary",
          (rc, server.lines[-3:], server.err_lines[-5:]))

    # Chunked prefill and preemption: 3 tokens a step (every prompt prefilled in chunks) and 16 blocks of 4 positions
    # (one sequence of max-model-len 64). A long request runs first; the 16 others join it and outgrow the pool.
    server = Server(bin_dir, model_dir, tp=2, args=["--max-num-batched-tokens", "3", "--block-size", "4",
                                                    "--num-blocks", "16", "--max-model-len", "64"])
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)
        # running: 50 more steps at least
        conn, resp, _ = open_stream(server.url, {"model": name, "prompt": WORDS[4], "max_tokens": 50, "ignore_eos": True})
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            texts = list(pool.map(lambda i: client.completions.create(model=name, prompt=WORDS[i], max_tokens=NEW,
                                                                      temperature=0).choices[0].text, range(16)))
        resp.read()
        conn.close()
        pre = metric(server.url, "serve_preemptions_total")
        bad = [(i, texts[i], want[i]) for i in range(16) if texts[i] != want[i]]
        check(not bad and pre and pre > 0, f"prefill in chunks of 3 tokens and {pre} preemptions: same texts", bad)
    finally:
        server.stop()

    # A rank dies mid-stream: 503 in the stream, then the server exits with an error.
    server = Server(bin_dir, model_dir, tp=2)
    try:
        conn, resp, first = open_stream(server.url, {"model": name, "prompt": WORDS[2], "max_tokens": 1900,
                                                     "ignore_eos": True})
        os.kill(server.rank_pid(1), signal.SIGKILL)
        rest = resp.read().decode(errors="replace")
        rc = server.proc.wait(60)
    except Exception as e:  # noqa: BLE001
        rest, rc = repr(e), None
    finally:
        server.stop()
    errors = [l for l in server.err_lines if "error: serve:" in l]
    check(first and "\"code\":503" in rest.replace(" ", "") and rc not in (0, None) and errors,
          "a rank killed mid-stream: 503 in the stream, the server exits non-zero with an error line",
          (rest[-500:], rc, server.err_lines[-5:]))
    # Prefix caching: 16 requests sharing a long system prompt, on a server with it (the default) and one without:
    # the same greedy texts; with it, the shared blocks are found (hits counted in /metrics), without it none.
    system = " ".join(WORDS) * 3
    shared = [tok(system + " " + w)["input_ids"] for w in WORDS]
    runs = {}
    for flags in ([], ["--no-enable-prefix-caching"]):
        server = Server(bin_dir, model_dir, tp=2, args=flags)
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)
            first = client.completions.create(model=name, prompt=shared[0], max_tokens=NEW, temperature=0).choices[0].text
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                rest = list(pool.map(lambda p: client.completions.create(model=name, prompt=p, max_tokens=NEW,
                                                                         temperature=0).choices[0].text, shared[1:]))
            runs[bool(flags)] = ([first] + rest, metric(server.url, "serve_prefix_cache_hits_total"),
                                 metric(server.url, "serve_prefix_cache_queries_total"))
        finally:
            server.stop()
    (on, hits, queries), (off, hits_off, _) = runs[False], runs[True]
    check(on == off and hits and hits >= 15 * (len(tok(system)["input_ids"]) // 16) * 16 and hits_off == 0,
          f"prefix caching: 16 requests sharing a {len(tok(system)['input_ids'])}-token system prompt, {hits:.0f} of "
          f"{queries:.0f} prompt tokens found in the cache, the same texts as without it",
          ([(a, b) for a, b in zip(on, off) if a != b], hits, hits_off))
    # Speculative decoding by prompt lookup: the greedy texts are transformers' still, with draft tokens scored and
    # some accepted (the 16 prompts, concurrently, and each once more after its own text: a prompt that repeats).
    server = Server(bin_dir, model_dir, tp=2, args=["--speculative-config",
                                                    '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}'])
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", timeout=120, max_retries=0)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            texts = list(pool.map(lambda i: client.completions.create(model=name, prompt=WORDS[i], max_tokens=NEW,
                                                                      temperature=0).choices[0].text, range(16)))
        repeat = [client.completions.create(model=name, prompt=WORDS[i] + want[i] + WORDS[i], max_tokens=NEW,
                                            temperature=0).choices[0].text for i in range(4)]
        drafted = metric(server.url, "serve_spec_decode_draft_tokens_total")
        accepted = metric(server.url, "serve_spec_decode_accepted_tokens_total")
    finally:
        server.stop()
    bad = [(i, texts[i], want[i]) for i in range(16) if texts[i] != want[i]]
    check(not bad and drafted and drafted > 0 and accepted and accepted > 0,
          f"speculative decoding (prompt lookup, 4 tokens): transformers' greedy texts, {accepted:.0f} of "
          f"{drafted:.0f} draft tokens accepted", (bad, drafted, accepted, repeat))
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
