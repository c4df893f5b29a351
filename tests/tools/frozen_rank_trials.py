"""A frozen rank ends its job, named, within a bound: SIGSTOP one rank of a TP 2 llama_train job under tprun.

    python tests/tools/frozen_rank_trials.py BIN_DIR [--trials 20] [--parallel 4] [--watchdog-timeout 30]
                                                     [--bound 60]

Each trial launches `tprun --nproc-per-node 2 --watchdog-timeout T llama_train --tp 2 ...` (steps without end, the
process group's timeout left at its 300 s default), waits for training to run, then SIGSTOPs rank (trial % 2),
found by its RANK among tprun's children. The trial passes when tprun exits 1 within --bound seconds of the
SIGSTOP and says "tprun: watchdog: rank R (pid P) is frozen" for that rank and pid. A job still running at
bound + 60 s is a hang: it is killed and counted. Prints one line per trial and a `summary` line; exits 1 if any
trial failed.
"""
import argparse
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

TRAIN = ["llama_train", "--tp", "2", "--steps", "1000000", "--log-every", "1", "--dim", "64", "--layers", "2",
         "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--seq-len", "16", "--batch", "4"]


def rank_pids(tprun_pid):
    """{RANK: pid} of tprun's children (each rank is a direct child)."""
    out = {}
    try:
        children = open(f"/proc/{tprun_pid}/task/{tprun_pid}/children").read().split()
    except OSError:
        return out
    for pid in children:
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        for kv in env:
            if kv.startswith(b"RANK="):
                out[int(kv[5:])] = int(pid)
    return out


def trial(i, args):
    victim = i % 2
    with tempfile.TemporaryFile(mode="w+") as log:
        cmd = [os.path.join(args.bin_dir, "tprun"), "--nproc-per-node", "2", "--master-port", "0",
               "--watchdog-timeout", str(args.watchdog_timeout), "--grace-seconds", "2", *TRAIN]
        env = dict(os.environ)
        env.pop("DTENSOR_TIMEOUT_SEC", None)  # the 300 s default: the watchdog must act first
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=args.bin_dir)
        started = time.monotonic()

        def text():
            log.seek(0)
            return log.read()

        try:
            # Training runs: rank 0 has printed a few steps (bounded: 120 s).
            while len(re.findall(r"\]: step ", text())) < 3:
                if proc.poll() is not None or time.monotonic() - started > 120:
                    return i, "setup", f"training did not start (exit {proc.poll()}): {text()[-600:]}", 0.0
                time.sleep(0.2)
            pids = rank_pids(proc.pid)
            if victim not in pids:
                return i, "setup", f"rank {victim} not found among tprun's children {pids}", 0.0
            pid = pids[victim]
            os.kill(pid, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                code = proc.wait(timeout=args.bound + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                for p in pids.values():
                    try:
                        os.kill(p, signal.SIGKILL)
                    except OSError:
                        pass
                proc.wait()
                return i, "HANG", f"rank {victim} stopped, job still running after {args.bound + 60} s", 0.0
            took = time.monotonic() - stopped
            named = f"tprun: watchdog: rank {victim} (pid {pid}) is frozen" in text()
            if code == 1 and named and took <= args.bound:
                return i, "ok", f"rank {victim} named, job ended in {took:.1f} s", took
            return i, "wrong", f"exit {code}, named={named}, {took:.1f} s: {text()[-800:]}", took
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bin_dir")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--watchdog-timeout", type=float, default=30)
    parser.add_argument("--bound", type=float, default=60)
    args = parser.parse_args()
    args.bin_dir = os.path.abspath(args.bin_dir)
    counts = {"ok": 0, "HANG": 0, "wrong": 0, "setup": 0}
    took = []
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        for i, verdict, what, seconds in pool.map(lambda k: trial(k, args), range(args.trials)):
            counts[verdict] += 1
            if verdict == "ok":
                took.append(seconds)
            print(f"trial {i:2d}: {verdict}: {what}", flush=True)
    print(f"summary trials={args.trials} ok={counts['ok']} hangs={counts['HANG']} wrong={counts['wrong']} "
          f"setup_errors={counts['setup']} watchdog_timeout_s={args.watchdog_timeout:g} "
          f"max_end_s={max(took, default=0):.1f} bound_s={args.bound:g}")
    sys.exit(0 if counts["ok"] == args.trials else 1)


if __name__ == "__main__":
    main()
