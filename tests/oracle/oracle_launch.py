"""Multi-process launcher shared by the PyTorch oracles (dtensor_oracle.py, tp_styles_oracle.py).

`run_on_ranks(world_size, setup, run_case, cases)` spawns one process per rank (multiprocessing
"spawn", CPU, Gloo on 127.0.0.1), runs every case on every rank and returns what each rank produced.
In each worker:
  * MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE are set, warnings and logging silenced,
    torch.set_num_threads(1), init_process_group("gloo", timeout=pg_timeout_s);
  * ctx = setup(rank)   (e.g. the device meshes), then for case i:  run_case(i, case, ctx, rank)
    -> a JSON-able dict; an exception escaping run_case (a bug in the oracle, not a PyTorch error the
    case records itself) becomes {"error": "OracleFailure: <Type>: <message>", "trace": ...};
  * every case's "error" is compared across ranks (all_gather_object); where ranks disagree the
    result gets "inconsistent_error": [error of rank 0, rank 1, ...].
setup and run_case must be picklable: module-level functions (those of the __main__ script are fine,
spawn re-imports it in the workers). ORACLE_DEBUG=1 prints "[rank<r>] <case id> <case>" to stderr
before each case.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback

from peer_exit import end_process_group


def agent_store(world_size, timeout_s):
    """The workers' store, served by this process on a port it binds itself (port 0: the kernel's choice, held from
    then on), as torchrun's agent serves it: the workers connect as clients (TORCHELASTIC_USE_AGENT_STORE), so no
    port is chosen, released and taken again later, which another process could take in between."""
    import datetime

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, world_size, True, datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def error_text(e):
    """"<Type>: <first up to 3 message lines joined by ' | '>", at most 400 characters."""
    msg = str(e).strip().splitlines()
    first = " | ".join(m.strip() for m in msg[:3]) if msg else ""
    return f"{type(e).__name__}: {first}"[:400]


def _worker(rank, world_size, port, setup, run_case, cases, outdir, pg_timeout_s):
    t_start = time.time()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the launcher serves the store (agent_store)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    import datetime
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=pg_timeout_s))
    ctx = setup(rank)
    t_init = time.time()
    results = []
    debug = bool(os.environ.get("ORACLE_DEBUG"))
    for i, case in enumerate(cases):
        if debug:
            print(f"[rank{rank}] {case['id']} {case}", file=sys.stderr, flush=True)
        try:
            r = run_case(i, case, ctx, rank)
        except Exception as e:  # noqa: BLE001
            r = {"error": "OracleFailure: " + error_text(e), "trace": traceback.format_exc()[-1500:]}
        results.append(r)
    # the error status of every case must be rank-consistent (an inconsistent error would
    # normally already have desynchronised the collectives and tripped the Gloo timeout)
    status = [None] * world_size
    dist.all_gather_object(status, [r.get("error") for r in results])
    for i, r in enumerate(results):
        errs = [status[k][i] for k in range(world_size)]
        if len(set(errs)) != 1:
            r["inconsistent_error"] = errs
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"results": results, "torch_version": torch.__version__,
                   "t_init": t_init - t_start, "t_cases": time.time() - t_init}, f)
    end_process_group(0)


def _launch_once(world_size, setup, run_case, cases, tmp, total_timeout_s, pg_timeout_s):
    """One run of the workers: (exitcodes, timed_out, first_failure). A worker that fails stops the others at once
    (they would only wait for it until the timeout); first_failure is its exit code (negative: a signal), or None."""
    import multiprocessing as mp

    store = agent_store(world_size, pg_timeout_s + total_timeout_s)
    port = store.port
    mp_ctx = mp.get_context("spawn")
    procs = [mp_ctx.Process(target=_worker, args=(r, world_size, port, setup, run_case, cases, tmp, pg_timeout_s))
             for r in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.time() + total_timeout_s
    first_failure = None
    while time.time() < deadline and any(p.is_alive() for p in procs):
        failed = [p for p in procs if p.exitcode not in (None, 0)]
        if failed:
            first_failure = failed[0].exitcode
            break
        time.sleep(0.05)
    alive = [p for p in procs if p.is_alive()]
    timed_out = bool(alive) and first_failure is None
    for p in alive:
        p.kill()
    for p in procs:
        p.join(5)
    if first_failure is None:
        first_failure = next((p.exitcode for p in procs if p.exitcode not in (None, 0) and p not in alive), None)
    return [p.exitcode for p in procs], timed_out, first_failure


def run_on_ranks(world_size, setup, run_case, cases, *, total_timeout_s=150, pg_timeout_s=20):
    """Run `cases` on `world_size` spawned Gloo ranks (see the module docstring).

    Returns (per_rank, torch_version, timing): per_rank[r][i] is rank r's result dict for cases[i];
    timing is "worker startup X.Xs, cases Y.Ys" as measured on rank 0. If a worker fails (the others are stopped at
    once) or the ranks are not all done within total_timeout_s (stragglers are killed), prints
    "oracle failed: exitcodes=[...] timed_out=..." to stderr and exits with status 1; a worker killed by a signal
    of its own (a crash inside PyTorch) is said and the run repeated once.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONHASHSEED"] = "0"  # deterministic set ordering in PyTorch error messages
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in range(2):
            exitcodes, timed_out, failure = _launch_once(world_size, setup, run_case, cases, tmp, total_timeout_s,
                                                         pg_timeout_s)
            if not timed_out and failure is None:
                break
            # A worker killed by a signal of its own produced no result to compare (seen once, 2026-11-27: glibc's
            # "malloc(): unaligned tcache chunk detected" aborted a Gloo worker inside PyTorch in dtensor_oracle.py;
            # six runs after it passed): the run is repeated once, saying so.
            # A failure that is the oracle's (an exception, exit 1), a second crash or a hang fails at once.
            crashed = failure is not None and failure < 0
            if attempt == 0 and crashed:
                print(f"oracle: a PyTorch worker died by signal {-failure} before the cases finished "
                      f"(exitcodes={exitcodes}): a crash inside PyTorch, not a result; running the oracle once more",
                      file=sys.stderr)
                continue
            print(f"oracle failed: exitcodes={exitcodes} timed_out={timed_out}", file=sys.stderr)
            sys.exit(1)
        per_rank = []
        for r in range(world_size):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                doc_r = json.load(f)
            per_rank.append(doc_r["results"])
            if r == 0:
                torch_version = doc_r["torch_version"]
                timing = f"worker startup {doc_r['t_init']:.1f}s, cases {doc_r['t_cases']:.1f}s"
    return per_rank, torch_version, timing
