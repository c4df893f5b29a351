"""A request that fails inside the engine fails alone; a failure that leaves the ranks out of step stops every rank
promptly, saying why; ids past the tokenizer decode to nothing. Real servers (tprun ... serve) on tiny checkpoints saved
by transformers, real HTTP clients, transformers' decode as the oracle.

    python tests/inference/serve_fault_test.py <build/bin>

Faults are injected with serve's test hook DTENSOR_SERVE_FAULT (inference/serving/fault_injection.h):
  - output:N at TP 1 and 2: rank 0 throws while turning step N's logits into one sequence's token. Under 4 concurrent
    requests (2 plain, 2 streamed) exactly one is answered 500 (its stream an error event) naming the error; the other
    three equal transformers' greedy texts; /health stays 200; 4 more requests then succeed; SIGTERM drains and the
    job exits 0 with failed=0.
  - forward:N:0 at TP 1: the step's requests are answered 500, the rest (and later ones) succeed; the server goes on.
  - forward:150:R at TP 2 (R = 0, 1, all): the ranks are out of step: every open request is answered 503 (stream: an
    error event), the job exits 1 within 60 s, and an `error:` line names the injected failure.
  - a checkpoint whose vocabulary is padded past its tokenizer (lm_head's padded rows made likely), served at TP 2
    with sampling (temperature 1, seeds): the texts equal transformers' decode of the returned ids
    (return_token_ids), padded ids among them; streamed texts equal the plain ones; logprobs work; the load says once
    that the vocabulary is larger. `llama_generate` on it succeeds; `tokenize --decode` refuses a padded id without
    --skip-unknown-ids and decodes it as transformers with it; a line that is not ids is an error naming the line.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_fixture import Checks, WORDS, Server, make_checkpoint  # noqa: E402

NEW = 12
check = Checks()


def hostport(url):
    host, port = url[len("http://"):].split(":")
    return host, int(port)


def request(url, body, timeout=90):
    """(status, text, error message) of a completion; streamed when body["stream"]."""
    conn = httpclient.HTTPConnection(*hostport(url), timeout=timeout)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read().decode(errors="replace")
    except (OSError, httpclient.HTTPException) as e:
        return None, "", repr(e)
    finally:
        conn.close()
    if not body.get("stream"):
        data = json.loads(raw) if raw.strip().startswith("{") else {}
        if r.status != 200:
            return r.status, "", data.get("error", {}).get("message", raw)
        return 200, data["choices"][0]["text"], ""
    text, status, error = "", r.status, ""
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: "):])
        if "error" in chunk:
            status, error = chunk["error"].get("code"), chunk["error"]["message"]
        else:
            text += chunk["choices"][0]["text"]
    return status, text, error


def health(url):
    try:
        conn = httpclient.HTTPConnection(*hostport(url), timeout=10)
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None


def concurrent_requests(url, name, prompts, streams):
    body = lambda i, s: {"model": name, "prompt": WORDS[i], "max_tokens": NEW, "temperature": 0, "ignore_eos": True,
                         "stream": s}
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda a: request(url, body(*a)), zip(prompts, streams)))


def drain_and_exit(server):
    """SIGTERM to tprun: serve drains and every rank exits 0. (rc, rank 0's summary line)."""
    server.proc.send_signal(signal.SIGTERM)
    try:
        rc = server.proc.wait(60)
    except subprocess.TimeoutExpired:
        rc = None
    server.stop()
    summary = next((l for l in server.lines if "summary " in l), "")
    return rc, summary


def fails_alone(bin_dir, model_dir, name, want, tp, fault, where):
    """The fault touches some requests (500, named); the others equal HF; the server goes on; SIGTERM exits 0."""
    os.environ["DTENSOR_SERVE_FAULT"] = fault
    try:
        server = Server(bin_dir, model_dir, tp=tp, args=["--max-num-seqs", "8"])
    finally:
        del os.environ["DTENSOR_SERVE_FAULT"]
    try:
        prompts = [0, 1, 2, 3]
        results = concurrent_requests(server.url, name, prompts, [False, True, False, True])
        failed = [(i, r) for i, r in zip(prompts, results) if r[0] != 200]
        good = [(i, r) for i, r in zip(prompts, results) if r[0] == 200]
        named = all(r[0] == 500 and f"injected failure in the {where}" in r[2] for _, r in failed)
        wrong = [(i, r[1], want[i]) for i, r in good if r[1] != want[i]]
        many = len(failed) == 1 if where == "output" else len(failed) >= 1
        check(many and named and not wrong,
              f"TP {tp} {fault}: {len(failed)} request(s) answered 500 naming the failure, the other {len(good)} equal HF",
              (failed, wrong))
        logged = server.wait_err(lambda l: "error: serve: request" in l and f"injected failure in the {where}" in l)
        check(logged, f"TP {tp} {fault}: the failure is logged on the spot", server.err_lines[-5:])
        check(health(server.url) == 200, f"TP {tp} {fault}: /health stays 200")
        after = concurrent_requests(server.url, name, [4, 5, 6, 7], [True, False, True, False])
        bad = [(i, r) for i, r in zip([4, 5, 6, 7], after) if r[0] != 200 or r[1] != want[i]]
        check(not bad, f"TP {tp} {fault}: 4 later requests (2 streamed) equal HF", bad)
    finally:
        rc, summary = drain_and_exit(server)
    check(rc == 0 and "failed=0" in summary, f"TP {tp} {fault}: SIGTERM drains, the job exits 0 with failed=0",
          (rc, summary, server.err_lines[-5:]))


def stops_every_rank(bin_dir, model_dir, name, fault):
    """The ranks are out of step: open requests 503, the job exits 1 within 60 s, an error line names the fault.
    The fault comes at step 150; by then the 4 requests (long ones) are running: the 2 streams have their first
    token, the 2 plain ones were sent first."""
    os.environ["DTENSOR_SERVE_FAULT"] = fault
    try:
        server = Server(bin_dir, model_dir, tp=2, args=["--max-num-seqs", "8"])
    finally:
        del os.environ["DTENSOR_SERVE_FAULT"]
    start = time.time()
    try:
        body = lambda i, s: {"model": name, "prompt": WORDS[i], "max_tokens": 1000, "ignore_eos": True, "stream": s}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            plain = [pool.submit(request, server.url, body(i, False)) for i in (0, 2)]
            streams = []
            for i in (1, 3):
                conn = httpclient.HTTPConnection(*hostport(server.url), timeout=90)
                conn.request("POST", "/v1/completions", json.dumps(body(i, True)), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                first = resp.readline()
                streams.append((conn, resp, first))
            results = [f.result() for f in plain]
            for conn, resp, first in streams:
                rest = resp.read().decode(errors="replace")
                conn.close()
                results.append((503 if first.startswith(b"data: {") and '"code":503' in rest.replace(" ", "") else None,
                                "", rest[-300:]))
        try:
            rc = server.proc.wait(60)
        except subprocess.TimeoutExpired:
            rc = None
    finally:
        server.stop()
    elapsed = time.time() - start
    answered = all(r[0] == 503 for r in results)
    check(answered, f"TP 2 {fault}: every open request is answered 503 (streams: an error event)", results)
    named = any("error:" in l and "injected failure in the forward" in l for l in server.err_lines)
    check(rc == 1 and elapsed < 60 and named, f"TP 2 {fault}: the job exits 1 in {elapsed:.1f} s, naming the failure",
          (rc, server.err_lines[-6:]))


def padded_checkpoint(root, model_dir):
    """model_dir's model with its vocabulary padded past the tokenizer, the padded rows of lm_head made likely."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    n = len(tok)
    padded = (n + 64 + 63) // 64 * 64
    model.resize_token_embeddings(padded, mean_resizing=False)
    torch.manual_seed(1)
    with torch.no_grad():
        rows = model.lm_head.weight
        rows[n:] = 3.0 * rows[torch.randint(0, n, (padded - n,))]
    model.config.vocab_size = padded
    out = os.path.join(root, "padded")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out, tok, n, padded


def padded_vocabulary(bin_dir, root, model_dir):
    out, tok, n, padded = padded_checkpoint(root, model_dir)
    name = os.path.basename(out)
    server = Server(bin_dir, out, tp=2)
    try:
        notes = server.wait_err(lambda l: "larger than the tokenizer's" in l)
        check(len(notes) == 1, f"padded vocabulary ({padded} rows, {n} tokens): the load says so once", server.err_lines)
        bodies = [{"model": name, "prompt": WORDS[i], "max_tokens": 24, "temperature": 1.0, "seed": 100 + i,
                   "ignore_eos": True, "return_token_ids": True} for i in range(8)]
        mismatched, padded_seen, results = [], 0, []
        for b in bodies:
            conn = httpclient.HTTPConnection(*hostport(server.url), timeout=90)
            conn.request("POST", "/v1/completions", json.dumps(b), {"Content-Type": "application/json"})
            r = conn.getresponse()
            data = json.loads(r.read())
            conn.close()
            if r.status != 200:
                mismatched.append((b["prompt"], r.status, data))
                continue
            ids, text = data["choices"][0]["token_ids"], data["choices"][0]["text"]
            results.append(text)
            padded_seen += sum(1 for i in ids if i >= n)
            if len(ids) != 24 or text != tok.decode(ids, skip_special_tokens=True):
                mismatched.append((b["prompt"], ids, text, tok.decode(ids, skip_special_tokens=True)))
        check(not mismatched and padded_seen > 0,
              f"sampled texts equal transformers' decode of their ids ({padded_seen} padded ids drawn)", mismatched)
        streamed = []
        for b in bodies[:4]:
            s = dict(b, stream=True)
            del s["return_token_ids"]
            streamed.append(request(server.url, s))
        bad = [(i, r, results[i]) for i, r in enumerate(streamed) if r[0] != 200 or r[1] != results[i]]
        check(not bad, "streamed with the same seeds: the same texts", bad)
        lp = request(server.url, dict(bodies[0], logprobs=3, return_token_ids=False))
        check(lp[0] == 200 and lp[1] == results[0], "with logprobs: answered, the same text", lp)
    finally:
        rc = server.stop()
    check(not any("error:" in l for l in server.err_lines), "no error line", server.err_lines[-5:])

    # llama_generate on the same checkpoint: ids past the tokenizer decode to nothing, no error.
    g = subprocess.run([os.path.join(bin_dir, "tprun"), "--nproc-per-node", "2", "llama_generate", "--hf-dir", out,
                        "--prompt", "The", "--max-new-tokens", "24", "--temperature", "1", "--seed", "3"],
                       capture_output=True, text=True, timeout=300)
    check(g.returncode == 0 and "summary" in g.stdout and g.stderr.count("larger than the tokenizer's") == 1,
          "llama_generate samples from a padded vocabulary at TP 2, saying so once",
          (g.returncode, g.stdout[-500:], g.stderr[-500:]))

    # tokenize --decode: a padded id is an error without --skip-unknown-ids, nothing with it (transformers' decode).
    ids = tok("Hello world")["input_ids"]
    line = " ".join(map(str, ids[:1] + [n + 3] + ids[1:])) + "\n"
    tz = os.path.join(bin_dir, "tokenize")
    strict = subprocess.run([tz, "--tokenizer", out, "--decode"], input=line, capture_output=True, text=True, timeout=60)
    check(strict.returncode == 2 and "line 1" in strict.stderr and str(n + 3) in strict.stderr,
          "tokenize --decode: an id past the tokenizer is an error naming the line and the id", strict.stderr)
    skip = subprocess.run([tz, "--tokenizer", out, "--decode", "--skip-unknown-ids"], input=line, capture_output=True,
                          text=True, timeout=60)
    want = tok.decode(ids[:1] + [n + 3] + ids[1:])
    check(skip.returncode == 0 and skip.stdout == want + "\n", "tokenize --decode --skip-unknown-ids equals transformers",
          (skip.stdout, want))
    bad = subprocess.run([tz, "--tokenizer", out, "--decode"], input="54 44\n54 442 x 223\n", capture_output=True,
                         text=True, timeout=60)
    check(bad.returncode == 2 and "line 2" in bad.stderr and "'x'" in bad.stderr,
          "tokenize --decode: a line that is not ids is an error naming the line and the field", bad.stderr)


def main():
    bin_dir = sys.argv[1]
    root = tempfile.mkdtemp(prefix="serve_fault_test_")
    model_dir, tok, hf_new = make_checkpoint(root, WORDS[:8], NEW)
    want = [tok.decode(n, skip_special_tokens=True) for n in hf_new]
    name = os.path.basename(model_dir)
    fails_alone(bin_dir, model_dir, name, want, 1, "output:3", "output")
    fails_alone(bin_dir, model_dir, name, want, 2, "output:3", "output")
    fails_alone(bin_dir, model_dir, name, want, 1, "forward:3:0", "forward")
    for fault in ("forward:150:1", "forward:150:0", "forward:150:all"):
        stops_every_rank(bin_dir, model_dir, name, fault)
    padded_vocabulary(bin_dir, root, model_dir)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
