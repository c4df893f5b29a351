"""No request can crash or stall serve: hostile bodies, a full queue, a frozen rank, and a soak, at TP 2 on a tiny
real checkpoint (serve_fixture.py), with real HTTP clients over loopback.

    python tests/inference/serve_reliability_test.py <build/bin> [--soak-requests N]

Checks:
  - an HTTP fuzz, each answered 4xx with OpenAI's error body while the server keeps serving (a plain completion
    succeeds after every one): 100,000 nested '[' inside "prompt" and at the top level (refused while parsing:
    400), a 10 MB body (413 from its Content-Length, never read whole), invalid UTF-8, NaN, huge numbers, wrong
    types, truncated and empty bodies; slow clients (headers dribbled, a body shorter than its Content-Length)
    while others are served;
  - a bounded queue: with --max-num-seqs 1 --max-queued-requests 1, two long requests open, the third is answered
    429 (rate_limit_error) at once; once one ends, requests are accepted again;
  - a frozen rank (SIGSTOP of rank 1 mid-stream) under tprun --watchdog-timeout 3: the stream ends with a 503
    error within seconds, the server exits non-zero naming the frozen rank;
  - a soak: 64 concurrent clients, N requests (default 2000) mixing plain, streamed, cancelled mid-stream and
    malformed ones: every accepted request is answered (200 with text, or its stream complete), every malformed
    one 400, none lost, no crash, and rank 0's RSS after the first quarter grows by less than 32 MB to the end.
Every wait is bounded. Exit 1 on a failure; one line per check, then a `summary` line.
"""
import argparse
import concurrent.futures
import http.client as httpclient
import json
import os
import random
import signal
import socket
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from serve_fixture import Checks, WORDS, Server, make_checkpoint  # noqa: E402



check = Checks()


def hostport(url):
    host, port = url[len("http://"):].split(":")
    return host, int(port)


def post(url, body, path="/v1/completions", timeout=60, headers=None):
    """(status, text) of a POST with `body` (bytes, or JSON-encoded)."""
    conn = httpclient.HTTPConnection(*hostport(url), timeout=timeout)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, data, dict({"Content-Type": "application/json"}, **(headers or {})))
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    finally:
        conn.close()


def error_of(text):
    try:
        return json.loads(text)["error"]
    except (ValueError, KeyError, TypeError):
        return None


def still_serving(url, name):
    status, text = post(url, {"model": name, "prompt": "The", "max_tokens": 2})
    return status == 200 and json.loads(text)["choices"][0]["finish_reason"] in ("length", "stop")


def metric(url, name):
    conn = httpclient.HTTPConnection(*hostport(url), timeout=30)
    try:
        conn.request("GET", "/metrics")
        for line in conn.getresponse().read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    finally:
        conn.close()
    return None


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def fuzz(url, name):
    deep = b"[" * 100000 + b"]" * 100000
    cases = [
        ("100,000 nested '[' in prompt", b'{"prompt": ' + deep + b"}", 400, "nests"),
        ("100,000 nested '[' at the top", deep, 400, "nests"),
        ("100,000 nested '{\"a\":'", b'{"a":' * 100000 + b"1" + b"}" * 100000, 400, "nests"),
        ("a 10 MB body", b'{"prompt": "' + b"x" * (10 << 20) + b'"}', 413, "larger than"),
        ("invalid UTF-8", b'{"model": "' + name.encode() + b'", "prompt": "\xff\xfe bad"}', 400, ""),
        ("NaN", b'{"prompt": "The", "temperature": NaN}', 400, ""),
        ("a huge max_tokens", {"prompt": "The", "max_tokens": 10 ** 30}, 400, "max_tokens"),
        ("1e309 temperature", b'{"prompt": "The", "temperature": 1e309}', 400, ""),
        ("a seed of 2**70", {"prompt": "The", "seed": 2 ** 70}, 400, "seed"),
        ("prompt an object", {"prompt": {"a": 1}}, 400, "prompt"),
        ("max_tokens a string", {"prompt": "The", "max_tokens": "10"}, 400, "max_tokens"),
        ("messages a string", ({"messages": "hi"}, "/v1/chat/completions"), 400, "messages"),
        ("a truncated body", b'{"prompt": "The", "max_tok', 400, "JSON"),
        ("an empty body", b"", 400, "JSON"),
        ("a token id past the vocabulary", {"prompt": [1, 2, 10 ** 12]}, 400, "vocabulary"),
    ]
    for label, body, want, words in cases:
        path = "/v1/completions"
        if isinstance(body, tuple):
            body, path = body
        t0 = time.time()
        try:
            status, text = post(url, body, path)
        except Exception as e:  # noqa: BLE001
            status, text = None, repr(e)
        err = error_of(text)
        ok = status == want and err is not None and words.lower() in err.get("message", "").lower()
        check(ok and still_serving(url, name), f"fuzz: {label}: {want} in {time.time() - t0:.2f} s, still serving",
              (status, text[:300]))

    # Slow clients: 8 connections that dribble their headers, and 4 that promise a longer body than they send,
    # hold server threads while others are served; each is closed (by the server's read timeout, or by us).
    slow = []
    for i in range(12):
        s = socket.create_connection(hostport(url), timeout=30)
        if i < 8:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        else:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"prompt\":")
        slow.append(s)
    served = all(still_serving(url, name) for _ in range(4))
    answers = []
    for s in slow[8:]:
        try:
            answers.append(s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace"))
        except OSError as e:
            answers.append(repr(e))
    for s in slow:
        s.close()
    check(served and still_serving(url, name), "fuzz: 12 slow clients hold connections while 4 others are served",
          answers)


def queue_full(bin_dir, model_dir, name):
    # Deterministic: rank 1 is stopped (SIGSTOP) while the limit is tested, so the running request cannot finish
    # and free its slot in between; the HTTP side (rank 0's threads) answers meanwhile. The watchdog (30 s) and the
    # collective timeout are far longer than the stop.
    server = Server(bin_dir, model_dir, tp=2, args=["--max-num-seqs", "1", "--max-queued-requests", "1"])
    follower = server.rank_pid(1)
    try:
        streams = []
        for i in range(2):
            conn = httpclient.HTTPConnection(*hostport(server.url), timeout=60)
            conn.request("POST", "/v1/completions", json.dumps({"model": name, "prompt": "The", "max_tokens": 1500,
                                                                "ignore_eos": True, "stream": True}),
                         {"Content-Type": "application/json"})
            streams.append(conn)
            if i == 0:
                first = conn.getresponse().readline()  # running
                os.kill(follower, signal.SIGSTOP)
        deadline = time.time() + 30
        while time.time() < deadline and metric(server.url, "serve_open_requests") != 2:
            time.sleep(0.02)
        t0 = time.time()
        status, text = post(server.url, {"model": name, "prompt": "The", "max_tokens": 2})
        took = time.time() - t0
        os.kill(follower, signal.SIGCONT)
        err = error_of(text) or {}
        check(first.startswith(b"data:") and status == 429 and err.get("type") == "rate_limit_error" and took < 5,
              f"queue: the third request past 1 running + 1 queued is answered 429 in {took:.2f} s", (status, text))
        for conn in streams:
            conn.close()  # both cancelled: their slots free
        deadline, ok = time.time() + 30, False
        while time.time() < deadline and not ok:
            ok = post(server.url, {"model": name, "prompt": "The", "max_tokens": 2})[0] == 200
            time.sleep(0.2)
        check(ok, "queue: once the streams are cancelled, requests are accepted again")
    finally:
        try:
            os.kill(follower, signal.SIGCONT)
        except OSError:
            pass
        server.stop()


def frozen_rank(bin_dir, model_dir, name):
    server = Server(bin_dir, model_dir, tp=2, tprun_args=["--watchdog-timeout", "3", "--grace-seconds", "5"])
    try:
        conn = httpclient.HTTPConnection(*hostport(server.url), timeout=60)
        conn.request("POST", "/v1/completions", json.dumps({"model": name, "prompt": "The", "max_tokens": 1900,
                                                            "ignore_eos": True, "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        first = resp.readline()
        victim = server.rank_pid(1)
        os.kill(victim, signal.SIGSTOP)
        t0 = time.time()
        rest = resp.read().decode(errors="replace")
        took = time.time() - t0
        rc = server.proc.wait(60)
    except Exception as e:  # noqa: BLE001
        first, rest, took, rc, victim = b"", repr(e), 0, None, -1
    finally:
        server.stop()
    named = any(f"tprun: watchdog: rank 1 (pid {victim}) is frozen" in l for l in server.err_lines)
    check(first.startswith(b"data:") and '"code":503' in rest.replace(" ", "") and took < 20 and rc not in (0, None)
          and named, f"a frozen rank mid-stream: 503 in the stream after {took:.1f} s, the server exits {rc} naming it",
          (rest[-400:], rc, server.err_lines[-6:]))


def soak(bin_dir, model_dir, name, total):
    server = Server(bin_dir, model_dir, tp=2)
    rank0 = server.rank_pid(0)
    counts = {"plain": 0, "stream": 0, "cancelled": 0, "malformed": 0}
    lost = []
    lock = threading.Lock()
    rss = {}

    def one(i):
        rnd = random.Random(i)
        kind = rnd.choices(["plain", "stream", "cancelled", "malformed"], [4, 3, 2, 1])[0]
        prompt = WORDS[i % len(WORDS)]
        body = {"model": name, "prompt": prompt, "max_tokens": rnd.randint(1, 8)}
        try:
            if kind == "plain":
                status, text = post(server.url, body)
                ok = status == 200 and json.loads(text)["choices"][0]["finish_reason"] in ("length", "stop")
            elif kind == "malformed":
                bad = rnd.choice([b'{"prompt": ', b'{"prompt": "x", "max_tokens": -1}', b'[' * 5000, b'{"bogus": 1}'])
                status, text = post(server.url, bad)
                ok = status == 400 and error_of(text) is not None
            else:
                conn = httpclient.HTTPConnection(*hostport(server.url), timeout=60)
                conn.request("POST", "/v1/completions", json.dumps(dict(body, stream=True, max_tokens=32 if kind ==
                                                                        "cancelled" else body["max_tokens"])),
                             {"Content-Type": "application/json"})
                resp = conn.getresponse()
                if kind == "cancelled":
                    ok = resp.status == 200 and resp.readline().startswith(b"data:")
                    conn.close()  # mid-stream
                else:
                    text = resp.read().decode()
                    ok = resp.status == 200 and text.rstrip().endswith("data: [DONE]")
                    conn.close()
        except Exception as e:  # noqa: BLE001
            ok, text = False, repr(e)
        with lock:
            counts[kind] += ok
            if not ok:
                lost.append((i, kind, str(locals().get("text", ""))[:200]))
            done = sum(counts.values()) + len(lost)
            if done == total // 4:
                rss["warm"] = rss_kb(rank0)

    t0 = time.time()
    try:
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            list(pool.map(one, range(total)))
        rss["end"] = rss_kb(rank0)
        alive = server.proc.poll() is None and still_serving(server.url, name)
    finally:
        rc = server.stop()
    growth_mb = (rss.get("end", 0) - rss.get("warm", 0)) / 1024
    check(not lost and alive and growth_mb < 32,
          f"soak: {total} requests from 64 clients in {time.time() - t0:.0f} s ({counts}): none lost, still serving, "
          f"rank 0 RSS {rss.get('warm', 0) // 1024} -> {rss.get('end', 0) // 1024} MB after warm-up", lost[:5])
    return rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("--soak-requests", type=int, default=2000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="serve_reliability_")
    model_dir, _, _ = make_checkpoint(root, WORDS[:2], 2, clear_top1=False)
    name = os.path.basename(model_dir)
    server = Server(args.bin_dir, model_dir, tp=2)
    try:
        fuzz(server.url, name)
    finally:
        rc = server.stop()
    # tprun exits 128 + SIGINT when stopped by it (torchrun's convention); serve itself exits 0 without an error line.
    check(rc == 130 and not any("error" in l for l in server.err_lines),
          "fuzz: the server ran until its SIGINT, no error", (rc, server.err_lines[-5:]))
    queue_full(args.bin_dir, model_dir, name)
    frozen_rank(args.bin_dir, model_dir, name)
    soak(args.bin_dir, model_dir, name, args.soak_requests)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
