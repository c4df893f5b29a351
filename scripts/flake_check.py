"""Runs the tests that can fail by chance N times under both backends, beside a CPU hog, and tables the passes.

    scripts/flake_check.sh N [--hogs H] [--only REGEX]

What runs in each round:
- first, once (PyTorch alone; DTENSOR_BACKEND means nothing to them): the PyTorch DTensor and TP-style oracle
  generators (spawned Gloo ranks), whose JSON the Oracle.* replays read;
- for DTENSOR_BACKEND=shm, then gloo:
  - dtensor_tests: the multi-process, fault, rendezvous, size-agreement, shared-memory, launcher, checkpoint-error,
    checkpoint-interop (torchrun + PyTorch DCP), async and oracle-replay suites;
  - llama_tests: the command-line, checkpoint, generation, data-parallel and async TP suites;
  - fault_soak: 4 random fault trials (a rank SIGKILLed or SIGSTOPped at a random phase), this round's seed;
- once, under one backend, alternating from round to round (shm in odd rounds, gloo in even ones): the
  transformers oracles (LlamaHF, the HF families, the tokenized corpus) and the oracles that ctest runs beside
  PyTorch / transformers (toy TP, Llama TP+SP, FSDP2 x TP, generation and text generation vs transformers, the
  tokenizers). Their PyTorch side (torchrun, Gloo) does not read DTENSOR_BACKEND, so
  each PyTorch launch runs N times; our side runs N/2 times on each backend. (Every round on both backends would
  make a 20-round sweep take 2 h 20 min on 2 cores; this keeps it near 1 h 40 min.)
--failure-paths: the short tests of failure, launch, rendezvous, watchdog, preemption and usage errors only (the bar:
>= 200 rounds on both backends beside 2 hogs): per backend, dtensor_tests' FAILURE_SUITES, llama_tests'
FAILURE_LLAMA_TESTS, and 2 fault_soak trials that SIGKILL a rank (the store's owner included) mid-collective, whose
survivors must exit 1 with a named error, never by a signal (SIGPIPE: status 141).
--jobs J (with --failure-paths): J commands at once. Most of these tests wait (for a timeout, a grace, a peer's
death), so 200 rounds one after another would take ~13 h on 2 cores; in parallel each test runs in a process of its
own, --chunk K repeats at a time (gtest's --gtest_repeat), interleaved so that every test advances alike, beside the
hogs and beside each other (more load than the hogs alone). --for-seconds S starts no command after S seconds and
tables what ran: the counts are those of the runs made, never of the rounds asked for.
--ledger FILE (with --jobs): every finished command appends its counts to FILE (JSON lines: test, backend, runs,
passes, commit, time); a later sweep with the same ledger runs only what each test still lacks of N and tables the
ledger's totals, so a sweep longer than one session adds up across sessions (each line names the commit it ran).
--pause-file PATH (with --jobs): while PATH exists no command starts and the hogs are stopped (touch it before a
build on the same 2 cores, remove it after); the commands in flight finish.
Every command is bounded by --timeout. H busy loops (default 1) run for the whole sweep. A failed run's output is
kept in build/flake_check/. The last line is `summary ...`; the exit status is 1 if anything failed.
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
BIN = os.path.join(BUILD, "bin")
PY = sys.executable
LOGS = os.path.join(BUILD, "flake_check")
COMMIT = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()

DTENSOR_SUITES = ["Failures", "Rendezvous", "SizeMismatch", "ShmBackend", "ShmAsync", "Tprun", "TprunWatchdog",
                  "TprunStore", "LaunchEnv",
                  "CheckpointErrors", "CheckpointInterop", "AsyncTP", "Oracle", "Parallelize", "StockModules",
                  "MixedPrecision", "Float8Linear", "Float8Styles", "RingAttention"]
LLAMA_SUITES = ["LlamaTrainCli", "LlamaCheckpoint", "LlamaGenerate", "LlamaGenerateCli", "LlamaAsyncTP",
                "LlamaDataParallelMesh", "LlamaDataParallelCheckpoint", "PagedGenerate", "PlanSearch",
                "Parallelisms/BuildModel", "BuildModelMemory", "BuildModelGradientSync", "MixedPrecisionTraining",
                "Float8Training", "LlamaDryRun", "ContextParallel"]
# transformers in a Python process beside each test (or once per process: the HF families and tokenizers)
LLAMA_ORACLE_SUITES = ["LlamaHF", "Cases/HfFamily", "HfFamilies", "Moe", "TokenizedCorpus"]
# ctest entries, run through ctest so their commands have one home (tests/CMakeLists.txt).
ORACLES = ["toy_tp_vs_pytorch", "llama_vs_pytorch", "llama_fsdp_tp_vs_pytorch", "llama_generate_vs_hf",
           "text_generate_vs_hf", "tokenizer", "serve_vs_hf", "inference", "config_fuzz_vs_hf",
           "llama_mixed_precision_vs_pytorch", "llama_float8_vs_torchao", "frozen_rank_trials", "serve_reliability", "serve_sampling_vs_hf", "serve_tools_vs_hf", "serve_structured_vs_hf", "serve_ep_vs_hf"]
# --failure-paths
FAILURE_SUITES = ["Failures", "Rendezvous", "SizeMismatch", "Tprun", "TprunWatchdog", "TprunStore", "LaunchEnv"]
FAILURE_LLAMA_TESTS = ["LlamaTrainCli", "LlamaCheckpoint.SigtermSavesAtTheNextStepBoundaryAndResumes",
                       "PlanSearch.LlamaPlanSearchJsonAndLlamaTrainPlanAuto"]
GENERATORS = ["oracle_generate", "oracle_styles_generate"]  # backend-independent: PyTorch alone
CTEST = shutil.which("ctest", path=os.path.dirname(PY) + os.pathsep + os.environ.get("PATH", "")) or "ctest"


def ctest(name):
    return [CTEST, "-R", f"^{name}$", "--output-on-failure"]


def run(cmd, env, timeout):
    """(exit status, output); 124 when the bound ran out (the process group is killed)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, cwd=BUILD)
    try:
        out, _ = p.communicate(timeout=timeout)
        return p.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out, _ = p.communicate()
        return 124, out + f"\n[flake_check] killed after {timeout} s\n"


class Tally:
    def __init__(self):
        self.runs, self.passes, self.order = {}, {}, []

    def add(self, test, backend, ok):
        key = (test, backend)
        if test not in self.order:
            self.order.append(test)
        self.runs[key] = self.runs.get(key, 0) + 1
        self.passes[key] = self.passes.get(key, 0) + (1 if ok else 0)

    def failures(self):
        return sum(self.runs[k] - self.passes[k] for k in self.runs)

    def table(self, backends):
        width = max([len(t) for t in self.order] + [4])
        lines = [f"{'test':<{width}}  " + "  ".join(f"{b:>7}" for b in backends)]
        for t in self.order:
            cells = []
            for b in backends:
                k = (t, b)
                cells.append(f"{self.passes[k]:>3}/{self.runs[k]:<3}" if k in self.runs else f"{'-':>7}")
            lines.append(f"{t:<{width}}  " + "  ".join(cells))
        return "\n".join(lines)


def save_log(tag, out):
    os.makedirs(LOGS, exist_ok=True)
    path = os.path.join(LOGS, re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + ".log")
    with open(path, "w") as f:
        f.write(out)
    return path


def gtest(binary, suites, backend, rnd, env, tally, timeout, only):
    """Runs the suites in one process; every test's pass or failure goes to the tally. A crash or overrun
    (no JSON report) is a failure of the row '<binary> process (...)'."""
    suites = [s for s in suites if not only or re.search(only, s)]
    if not suites:
        return
    filt = ":".join(s if "." in s else s + ".*" for s in suites)
    report = os.path.join(LOGS, f"{binary}.json")
    os.makedirs(LOGS, exist_ok=True)
    if os.path.exists(report):
        os.remove(report)
    t0 = time.time()
    rc, out = run([os.path.join(BIN, binary), f"--gtest_filter={filt}", f"--gtest_output=json:{report}"], env, timeout)
    doc = None
    if os.path.exists(report):
        with open(report) as f:
            doc = json.load(f)
    failed = []
    if doc is not None:
        for suite in doc.get("testsuites", []):
            for t in suite.get("testsuite", []):
                if t.get("result", "COMPLETED") != "COMPLETED" or t.get("status") == "NOTRUN":
                    continue
                ok = not t.get("failures")
                tally.add(f"{suite['name']}.{t['name']}", backend, ok)
                if not ok:
                    failed.append(f"{suite['name']}.{t['name']}")
    whole_ok = doc is not None and (rc == 0) == (not failed)
    tally.add(f"{binary} process ({suites[0] if len(suites) == 1 else f'{len(suites)} suites'})", backend, whole_ok)
    if failed or not whole_ok:
        path = save_log(f"round{rnd}-{backend}-{binary}", out)
        print(f"[flake] round {rnd} {backend}: {binary} FAILED {failed or f'(exit {rc}, no report)'}; output in {path}",
              flush=True)
    print(f"[flake] round {rnd} {backend}: {binary} ({len(suites)} suites) in {time.time() - t0:.0f} s", flush=True)


def soak(trials, backend, seed, extra=()):
    """fault_soak's command: `trials` random fault trials on `backend`."""
    return [os.path.join(BIN, "fault_soak"), "--trials", str(trials), "--jobs", "2", "--timeout", "3", "--slack", "5",
            "--backends", backend, "--seed", str(seed), *extra]


def command(name, cmd, backend, rnd, env, tally, timeout):
    t0 = time.time()
    rc, out = run(cmd, env, timeout)
    tally.add(name, backend, rc == 0)
    note = ""
    if rc != 0:
        note = f" FAILED (exit {rc}); output in {save_log(f'round{rnd}-{backend}-{name}', out)}"
    print(f"[flake] round {rnd} {backend}: {name} {time.time() - t0:.0f} s{note}", flush=True)


def list_tests(binary, filt):
    """The gtest names a filter selects (the binary's --gtest_list_tests)."""
    out = subprocess.run([os.path.join(BIN, binary), f"--gtest_filter={filt}", "--gtest_list_tests"], check=True,
                         capture_output=True, text=True).stdout
    names, suite = [], None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()
        else:
            names.append(suite + line.split("#")[0].strip())
    return names


def ledger_runs(path):
    """(test, backend) -> runs recorded in a --ledger file (missing file: none)."""
    runs = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    e = json.loads(line)
                    runs[(e["test"], e["backend"])] = runs.get((e["test"], e["backend"]), 0) + e["runs"]
    return runs


def ledger_tally(path):
    """The ledger's totals as a Tally, and the commits its lines name."""
    tally, commits = Tally(), []
    with open(path) as f:
        for line in f:
            if line.strip():
                e = json.loads(line)
                key = (e["test"], e["backend"])
                if e["test"] not in tally.order:
                    tally.order.append(e["test"])
                tally.runs[key] = tally.runs.get(key, 0) + e["runs"]
                tally.passes[key] = tally.passes.get(key, 0) + e["passes"]
                if e["commit"] not in commits:
                    commits.append(e["commit"])
    return tally, commits


def pause_hogs(args, hogs, stop):
    """While --pause-file exists the hogs are stopped (SIGSTOP), and continued after."""
    paused = False
    while not stop.is_set():
        want = os.path.exists(args.pause_file)
        if want != paused:
            for h in hogs:
                h.send_signal(signal.SIGSTOP if want else signal.SIGCONT)
            paused = want
            print(f"[flake] {'paused' if want else 'resumed'} ({args.pause_file})", flush=True)
        stop.wait(2)
    for h in hogs:
        h.send_signal(signal.SIGCONT)


def failure_paths_parallel(args, backends, tally, t_start):
    """--failure-paths --jobs J: every (test, backend) runs args.rounds times in chunks of --chunk repeats, J
    commands at once, chunks interleaved across tests. A test's passes are its '[       OK ]' lines; a chunk that
    crashed or overran counts its missing repeats as failures."""
    only = args.only
    units = []  # (tally name, argv, backend, repeats expected, kind)
    for backend in backends:
        env = dict(os.environ, OMP_NUM_THREADS="1", DTENSOR_BACKEND=backend)
        for binary, suites in (("dtensor_tests", FAILURE_SUITES), ("llama_tests", FAILURE_LLAMA_TESTS)):
            suites = [s for s in suites if not only or re.search(only, s)]
            if not suites:
                continue
            for name in list_tests(binary, ":".join(s if "." in s else s + ".*" for s in suites)):
                for first in range(0, args.rounds, args.chunk):
                    n = min(args.chunk, args.rounds - first)
                    units.append((first, name, [os.path.join(BIN, binary), f"--gtest_filter={name}",
                                                f"--gtest_repeat={n}"], backend, env, n, "gtest"))
        if not only or re.search(only, "fault_soak"):
            trials = 2 * args.rounds  # as the serial mode: 2 SIGKILL trials per round and backend
            for first in range(0, trials, 10):
                n = min(10, trials - first)
                units.append((first // 2, "fault_soak (SIGKILL trials, 10 per run)",
                              soak(n, backend, args.seed + first, ["--signals", "kill", "--launch", "hand"]),
                              backend, env, n, "command"))
    if args.ledger:  # what earlier sweeps with this ledger already ran: only the rest is scheduled
        done_before = ledger_runs(args.ledger)
        kept = []
        for u in units:
            first, name, _, backend, _, n, kind = u
            had = done_before.get((name, backend), 0)
            if kind == "command":  # fault_soak: one tally entry per command of n trials
                had_trials = had * 10
                if first * 2 + n <= had_trials:
                    continue
            elif first + n <= had:
                continue
            kept.append(u)
        print(f"[flake] ledger {args.ledger}: {sum(done_before.values())} runs already counted, "
              f"{len(units) - len(kept)} of {len(units)} commands skipped", flush=True)
        units = kept
    units.sort(key=lambda u: u[0])  # interleaved: every test's first chunk, then every second one, ...
    lock, done = threading.Lock(), [0]
    print(f"[flake] {len(units)} commands, {args.jobs} at once", flush=True)

    def one(unit):
        first, name, argv, backend, env, n, kind = unit
        while args.pause_file and os.path.exists(args.pause_file):
            time.sleep(2)
        if args.for_seconds and time.time() - t_start > args.for_seconds:
            return
        rc, out = run(argv, env, args.timeout)
        with lock:
            done[0] += 1
            if kind == "gtest":
                ok = len(re.findall(r"^\[       OK \] " + re.escape(name) + r" \(\d+ ms\)$", out, re.M))
                for i in range(n):
                    tally.add(name, backend, i < ok)
                bad = ok < n or rc != 0
            else:
                tally.add(name, backend, rc == 0)
                bad = rc != 0
            if args.ledger:
                passes = (min(ok, n) if kind == "gtest" else int(rc == 0))
                with open(args.ledger, "a") as f:
                    f.write(json.dumps({"test": name, "backend": backend, "runs": n if kind == "gtest" else 1,
                                        "passes": passes, "commit": COMMIT, "time": int(time.time())}) + "\n")
            note = ""
            if bad:
                note = f" FAILED (exit {rc}); output in {save_log(f'{name}-{backend}-from{first}', out)}"
            if bad or done[0] % 25 == 0:
                print(f"[flake] {done[0]}/{len(units)} commands, {tally.failures()} failures, "
                      f"{time.time() - t_start:.0f} s: {name} {backend} x{n}{note}", flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, units))


def main():
    ap = argparse.ArgumentParser(prog="flake_check.sh", description=__doc__.split("\n")[0])
    ap.add_argument("rounds", type=int, help="rounds (N); the bar is 0 failures at N >= 20")
    ap.add_argument("--hogs", type=int, default=None, help="busy loops beside the tests (default 1; 2 with --failure-paths)")
    ap.add_argument("--failure-paths", action="store_true",
                    help="only the failure, launch, rendezvous, watchdog, preemption and usage-error tests")
    ap.add_argument("--only", default="", help="only the suites / oracles whose name matches this regex")
    ap.add_argument("--backends", default="shm,gloo", help="DTENSOR_BACKEND values (default shm,gloo)")
    ap.add_argument("--timeout", type=int, default=900, help="bound of each command, in seconds (default 900)")
    ap.add_argument("--seed", type=int, default=1000, help="fault_soak's seed in round r is seed + r")
    ap.add_argument("--jobs", type=int, default=1, help="with --failure-paths: commands at once (default 1)")
    ap.add_argument("--chunk", type=int, default=10, help="with --jobs: repeats of a test per process (default 10)")
    ap.add_argument("--for-seconds", type=int, default=0,
                    help="start no command after this many seconds (0: no limit); the table counts the runs made")
    ap.add_argument("--ledger", default="", help="with --jobs: append counts here; run only what the ledger lacks of N")
    ap.add_argument("--pause-file", default="", help="with --jobs: start nothing (hogs stopped) while this path exists")
    args = ap.parse_args()
    if args.hogs is None:
        args.hogs = 2 if args.failure_paths else 1
    if args.rounds < 1 or args.hogs < 0 or args.timeout < 1 or args.jobs < 1 or args.chunk < 1:
        ap.error("rounds, timeout, jobs and chunk must be >= 1, hogs >= 0")
    if (args.ledger or args.pause_file) and args.jobs == 1:
        ap.error("--ledger and --pause-file need --jobs > 1")
    if args.jobs > 1 and not args.failure_paths:
        ap.error("--jobs needs --failure-paths (the full sweep's oracles are heavy: one at a time)")
    backends = [b for b in args.backends.split(",") if b]
    if any(b not in ("shm", "gloo") for b in backends):
        ap.error(f"--backends takes shm and/or gloo, not {args.backends!r}")
    only = args.only
    hogs = [subprocess.Popen(["bash", "-c", "while :; do :; done"]) for _ in range(args.hogs)]
    tally, t_start = Tally(), time.time()
    print(f"[flake] {args.rounds} rounds, backends {backends}, {args.hogs} CPU hog(s), bound {args.timeout} s per "
          f"command", flush=True)
    stop = threading.Event()
    if args.pause_file:
        threading.Thread(target=pause_hogs, args=(args, hogs, stop), daemon=True).start()
    try:
        if args.jobs > 1:
            failure_paths_parallel(args, backends, tally, t_start)
        for rnd in range(1, args.rounds + 1 if args.jobs == 1 else 1):
            base = dict(os.environ, OMP_NUM_THREADS="1")
            if args.failure_paths:
                for backend in backends:
                    env = dict(base, DTENSOR_BACKEND=backend)
                    gtest("dtensor_tests", FAILURE_SUITES, backend, rnd, env, tally, args.timeout, only)
                    gtest("llama_tests", FAILURE_LLAMA_TESTS, backend, rnd, env, tally, args.timeout, only)
                    if not only or re.search(only, "fault_soak"):
                        command("fault_soak (2 SIGKILL trials)",
                                soak(2, backend, args.seed + rnd, ["--signals", "kill", "--launch", "hand"]),
                                backend, rnd, env, tally, args.timeout)
                print(f"[flake] round {rnd}/{args.rounds} done: {tally.failures()} failures so far, "
                      f"{time.time() - t_start:.0f} s", flush=True)
                continue
            for name in GENERATORS:
                if not only or re.search(only, name):
                    command(name, ctest(name), "any", rnd, base, tally, args.timeout)
            for backend in backends:
                env = dict(base, DTENSOR_BACKEND=backend)
                gtest("dtensor_tests", DTENSOR_SUITES, backend, rnd, env, tally, args.timeout, only)
                gtest("llama_tests", LLAMA_SUITES, backend, rnd, env, tally, args.timeout, only)
                if not only or re.search(only, "fault_soak"):
                    command("fault_soak (4 trials)", soak(4, backend, args.seed + rnd), backend, rnd, env, tally,
                            args.timeout)
            backend = backends[(rnd - 1) % len(backends)]
            env = dict(base, DTENSOR_BACKEND=backend)
            gtest("llama_tests", LLAMA_ORACLE_SUITES, backend, rnd, env, tally, args.timeout, only)
            for name in ORACLES:
                if not only or re.search(only, name):
                    command(name, ctest(name), backend, rnd, env, tally, args.timeout)
            print(f"[flake] round {rnd}/{args.rounds} done: {tally.failures()} failures so far, "
                  f"{time.time() - t_start:.0f} s", flush=True)
    finally:
        stop.set()
        for h in hogs:
            h.send_signal(signal.SIGCONT)
            h.kill()
            h.wait()
    if args.ledger and os.path.exists(args.ledger):
        this_run = tally.failures()
        tally, commits = ledger_tally(args.ledger)
        print(f"\n[flake] the ledger's totals ({args.ledger}; commits {', '.join(commits)}); this run: "
              f"{this_run} failures")
    print()
    print(tally.table([b for b in ["any"] + backends if any(k[1] == b for k in tally.runs)]))
    tests = len(tally.order)
    fewest = min(tally.runs.values()) if tally.runs else 0
    print(f"summary rounds={args.rounds} fewest_runs={fewest} tests={tests} test_runs={sum(tally.runs.values())} "
          f"failures={tally.failures()} hogs={args.hogs} jobs={args.jobs} backends={'+'.join(backends)} "
          f"wall_s={time.time() - t_start:.0f}")
    return 1 if tally.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
