"""What a newcomer following the README meets, through tprun as the README runs it:

    python tests/tools/newcomer_test.py <build/bin>

  - generated text on a terminal (tprun's stdout a pty): a random-weight model's control bytes and bytes outside
    UTF-8 are shown escaped (\\xNN), never sent raw; into a pipe the bytes are the model's;
  - a single-host tprun run without --master-port finds a free port by itself while another process holds 29500;
  - llama_train's tokenizing progress into a log file is a line per tenth, no carriage returns;
  - ./scripts/run.sh --help on a built tree lists llama_train's options without running the setup.
Exit 1 on a failure; one line per check, then a `summary` line.
"""
import os
import pty
import select
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(HERE, "..", "inference"))
from serve_fixture import Checks  # noqa: E402

check = Checks()


def on_pty(argv, timeout=300):
    """(exit status, bytes written to the terminal)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    out, deadline = b"", time.time() + timeout
    while time.time() < deadline:
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    os.close(master)
    p.wait(30)
    return p.returncode, out


def raw_controls(data):
    """Bytes a terminal would act on: C0 controls but newline, return and tab; DEL; bytes outside valid UTF-8."""
    bad = [b for b in data if (b < 0x20 and b not in (0x0a, 0x0d, 0x09)) or b == 0x7f]
    try:
        text = data.decode("utf-8")
        bad += [ord(c) for c in text if 0x80 <= ord(c) < 0xa0]
    except UnicodeDecodeError:
        bad.append(-1)
    return bad


def main():
    bin_dir = sys.argv[1]
    tprun = os.path.join(bin_dir, "tprun")
    gen = [tprun, "--nproc-per-node", "2", "llama_generate", "--random-init", "--vocab", "256", "--dim", "64",
           "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--prompt", "Hi",
           "--max-new-tokens", "200", "--temperature", "1", "--seed", "3", "--no-stream"]
    rc, out = on_pty(gen)
    lines = [l for l in out.split(b"\n") if l.startswith(b"[rank0]: [0]")]
    check(rc == 0 and lines and not raw_controls(b"\n".join(lines)) and b"\\x" in b"\n".join(lines),
          "on a terminal a random model's control and non-UTF-8 bytes are escaped", (rc, lines[:1], out[-300:]))
    piped = subprocess.run(gen, capture_output=True, timeout=300)
    check(piped.returncode == 0 and raw_controls(piped.stdout), "into a pipe the bytes are the model's own",
          piped.returncode)

    # 29500 held by another process: a single-host run still starts (a free port), as torchrun --standalone.
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    held = True
    try:
        holder.bind(("127.0.0.1", 29500))
        holder.listen(1)
    except OSError:
        held = False  # someone else holds it: the same situation
    try:
        r = subprocess.run([tprun, "--nproc-per-node", "2", os.path.join(bin_dir, "llama_train"), "--dim", "32",
                            "--layers", "1", "--heads", "2", "--kv-heads", "2", "--ffn-dim", "64", "--seq-len", "16",
                            "--steps", "2"], capture_output=True, text=True, timeout=300)
    finally:
        holder.close()
    check(r.returncode == 0 and "summary final_loss=" in r.stdout,
          f"tprun without --master-port runs while 29500 is taken ({'by this test' if held else 'already'})",
          (r.returncode, r.stderr[-500:]))

    # The tokenizing progress into a log: lines, no carriage returns.
    root = tempfile.mkdtemp(prefix="newcomer_test_")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "oracle", "hf_tokenizer_oracle.py"), "make", root,
                    "--kinds", "qwen2"], check=True, capture_output=True)
    data = os.path.join(root, "data.txt")
    with open(data, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog.\n" * 20000)
    env = dict(os.environ, DTENSOR_CACHE_DIR=os.path.join(root, "cache"))
    r = subprocess.run([tprun, "--nproc-per-node", "1", os.path.join(bin_dir, "llama_train"), "--tokenizer",
                        os.path.join(root, "qwen2"), "--data", data, "--dim", "32", "--layers", "1", "--heads", "2",
                        "--kv-heads", "2", "--ffn-dim", "64", "--seq-len", "16", "--steps", "1"],
                       capture_output=True, text=True, timeout=300, env=env)
    progress = [l for l in r.stderr.splitlines() if "tokenizing" in l]
    check(r.returncode == 0 and progress and "\r" not in r.stderr and any("100%" in l for l in progress),
          "tokenizing progress into a log: a line per tenth, no carriage returns", (r.returncode, r.stderr[-600:]))

    t0 = time.time()
    h = subprocess.run([os.path.join(ROOT, "scripts", "run.sh"), "--help"], capture_output=True, text=True, timeout=120)
    check(h.returncode == 0 and "--steps" in h.stdout and "[setup]" not in h.stdout + h.stderr,
          f"run.sh --help lists llama_train's options without the setup ({time.time() - t0:.1f} s)",
          (h.returncode, h.stdout[:300], h.stderr[:300]))
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
