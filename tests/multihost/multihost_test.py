"""Many hosts, on one machine: two network namespaces, each with its own hostname (a UTS namespace, as
`unshare --uts`), joined by a veth pair (10.77.0.1 and 10.77.0.2). Neither hostname resolves, and
GLOO_SOCKET_IFNAME is not set: each rank must find the interface that routes to MASTER_ADDR by itself.

    python tests/multihost/multihost_test.py build/bin

One command per host (`tprun --nnodes 2 --node-rank {0,1} --master-addr 10.77.0.1 --nproc-per-node 2
llama_train ...`), 2 hosts x 2 ranks. Checked, against the same run on one host (tprun --nproc-per-node 4):
  - TP 2 inside each host (shared memory) with DDP across the hosts (Gloo): the same losses;
  - the same with FSDP across the hosts;
  - TP 4 across both hosts: the same losses;
  - pipeline parallelism across the hosts (--pp 2) with TP 2 inside each: the same losses; the bytes that crossed
    the link per step (the veth's counters) and the median step printed beside the layouts above;
  - a checkpoint saved by the two hosts (--stop-after 3) resumes on one host at TP 2 and continues the
    uninterrupted run's losses;
  - rendezvous: `--rdzv-endpoint 10.77.0.1:P` on both hosts (no node ranks), host 1 started first: the same;
  - elastic restart (the soak, MULTIHOST_ELASTIC_TRIALS trials, default 2): `tprun --max-restarts 2`; at a
    random step one rank of host 1 is killed (even trials), or every process of host 1's namespace and its
    tprun is started again (odd trials); every host restarts from the newest checkpoint and the losses continue
    those of an uninterrupted run;
  - fail fast: host 1's tprun killed mid-run, host 0's tprun stops its ranks within seconds and names host 1
    (tprun's job watch), instead of waiting out the collectives' timeout.
Needs root (ip netns); without it, prints why and exits 0 (skipped). The namespaces are removed at the end and
on failure. Every run is bounded in time.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

STEPS = 6
TIMEOUT = 240
TRAIN = ["llama_train", "--steps", str(STEPS), "--log-every", "1", "--dim", "64", "--layers", "2", "--heads", "4",
         "--kv-heads", "2", "--ffn-dim", "128", "--seq-len", "16", "--batch", "4",
         "--mixed-precision", "off"]  # fp32: a TP 4 run resumed at TP 2 continues to 1e-5


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=60, check=check)


class Hosts:
    """Two namespaces h0, h1 (names unique to this process) joined by a veth pair."""

    def __init__(self):
        tag = str(os.getpid() % 100000)
        self.ns = [f"dth0_{tag}", f"dth1_{tag}"]
        self.addr = ["10.77.0.1", "10.77.0.2"]
        veth = [f"dtv0_{tag}", f"dtv1_{tag}"]
        self.veth = veth
        for ns in self.ns:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for i in range(2):
            sh("ip", "link", "set", veth[i], "netns", self.ns[i])
            sh("ip", "netns", "exec", self.ns[i], "ip", "addr", "add", self.addr[i] + "/24", "dev", veth[i])
            sh("ip", "netns", "exec", self.ns[i], "ip", "link", "set", veth[i], "up")
            sh("ip", "netns", "exec", self.ns[i], "ip", "link", "set", "lo", "up")

    def remove(self):
        for ns in self.ns:
            pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
            for pid in pids:  # what a killed tprun left behind
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check=False)  # takes its end of the veth pair with it

    def link_bytes(self):
        """Bytes host 0's end of the link has sent and received so far: what crossed between the hosts."""
        total = 0
        for way in ("tx_bytes", "rx_bytes"):
            out = sh("ip", "netns", "exec", self.ns[0], "cat", f"/sys/class/net/{self.veth[0]}/statistics/{way}")
            total += int(out.stdout.strip())
        return total

    def command(self, i, argv):
        """argv run on host i, under hostname host<i> (which does not resolve)."""
        inner = " ".join(f"'{a}'" for a in argv)
        return ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "sh", "-c", f"hostname host{i} && exec {inner}"]


def losses(out):
    return [float(x) for x in re.findall(r"step\s+\d+\s+loss ([0-9.]+)", out)]


def median_step_ms(out):
    m = re.search(r"median_step_ms=([0-9.]+)", out)
    return float(m.group(1)) if m else float("nan")


def run_two_hosts(hosts, bin_dir, port, args, rdzv=False):
    """rdzv: `--rdzv-endpoint 10.77.0.1:port` on both hosts instead of node ranks, host 1 started first."""
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
    env["DTENSOR_TIMEOUT_SEC"] = "60"
    procs = []
    for i in ([1, 0] if rdzv else [0, 1]):
        where = (["--rdzv-endpoint", f"{hosts.addr[0]}:{port}"] if rdzv else
                 ["--node-rank", str(i), "--master-addr", hosts.addr[0], "--master-port", str(port)])
        argv = [os.path.join(bin_dir, "tprun"), "--nnodes", "2", *where, "--nproc-per-node", "2", *TRAIN, *args]
        procs.append(subprocess.Popen(hosts.command(i, argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    if rdzv:
        procs.reverse()  # host 0's first
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=TIMEOUT)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            sys.exit(f"FAIL: a two-host run of {args} passed {TIMEOUT} s")
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            sys.exit(f"FAIL: two hosts, {args}: exit {p.returncode}\n{outs[0]}\n---\n{outs[1]}")
    return outs[0]


def run_one_host(bin_dir, nproc, args):
    argv = [os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(nproc), "--master-port", "0", *TRAIN, *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        sys.exit(f"FAIL: one host, {args}: exit {out.returncode}\n{out.stdout}\n{out.stderr}")
    return out.stdout


def fail_fast(hosts, bin_dir, port):
    """Kills host 1's tprun once the job trains; host 0 must stop within seconds, naming host 1."""
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
    env["DTENSOR_TIMEOUT_SEC"] = "120"  # far beyond what the watch should take
    procs = []
    for i in range(2):
        argv = [os.path.join(bin_dir, "tprun"), "--nnodes", "2", "--node-rank", str(i), "--master-addr", hosts.addr[0],
                "--master-port", str(port), "--nproc-per-node", "2", *TRAIN[:2], "100000", *TRAIN[3:], "--tp", "4"]
        procs.append(subprocess.Popen(hosts.command(i, argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env))
    lines, training = [], threading.Event()

    def read():
        for line in procs[0].stdout:
            lines.append(line)
            if "loss" in line:
                training.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not training.wait(TIMEOUT):
            print("FAIL fail fast: the job never trained\n" + "".join(lines))
            return False
        procs[1].kill()  # host 1's tprun (its ranks live on, orphaned, until their peers go)
        killed = time.monotonic()
        try:
            procs[0].wait(timeout=60)
        except subprocess.TimeoutExpired:
            print("FAIL fail fast: host 0 still running 60 s after host 1's tprun died")
            return False
        took = time.monotonic() - killed
        reader.join(10)
        out = "".join(lines)
        named = "the job failed first on host host1 (node 1)" in out
        ok = procs[0].returncode == 1 and named and took < 15
        print(f"{'ok  ' if ok else 'FAIL'} fail fast: host 0 stopped {took:.1f} s after host 1's tprun was killed "
              f"(exit {procs[0].returncode}, names host 1: {named})")
        if not ok:
            print(out[-3000:])
        return ok
    finally:
        for p in procs:
            p.kill()
            p.wait()


def last_losses(out):
    """Each step's loss as last printed (a restarted round prints the steps after its checkpoint again)."""
    by_step = {}
    for step, loss in re.findall(r"step\s+(\d+)\s+loss ([0-9.]+)", out):
        by_step[int(step)] = float(loss)
    return [by_step[k] for k in sorted(by_step)]


def elastic_trials(hosts, bin_dir, port, trials, seed=5):
    """The soak: `tprun --max-restarts 2` on both hosts, llama_train checkpointing every 5 steps and resuming.
    Once host 0 has logged a random step, even trials kill one rank of host 1 (SIGKILL), odd trials kill every
    process of host 1's namespace (its tprun too) and start its tprun again, as a cluster scheduler would. The
    job must restart from the newest checkpoint, finish, and give the uninterrupted run's losses."""
    import random
    rng = random.Random(seed)
    steps = 50
    args = ["--dp", "2", "--tp", "2", "--steps", str(steps)]
    want = losses(run_one_host(bin_dir, 4, args))
    ok = True
    for trial in range(trials):
        whole_host = trial % 2 == 1
        kill_at = rng.randint(3, steps - 25)  # 25 steps (>= 0.5 s) left to kill in
        env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        env["DTENSOR_TIMEOUT_SEC"] = "60"
        with tempfile.TemporaryDirectory() as ckpt:
            def start(i):
                argv = [os.path.join(bin_dir, "tprun"), "--nnodes", "2", "--node-rank", str(i), "--master-addr",
                        hosts.addr[0], "--master-port", str(port), "--nproc-per-node", "2", "--max-restarts", "2",
                        *TRAIN, *args, "--checkpoint-dir", ckpt, "--checkpoint-every", "5", "--resume"]
                return subprocess.Popen(hosts.command(i, argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, env=env)
            procs = [start(0), start(1)]
            lines, reached = [], threading.Event()

            def read():
                for line in procs[0].stdout:
                    lines.append(line)
                    m = re.search(r"step\s+(\d+)\s+loss", line)
                    if m and int(m.group(1)) >= kill_at:
                        reached.set()
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            what = None
            try:
                if reached.wait(TIMEOUT):
                    if whole_host:
                        pids = sh("ip", "netns", "pids", hosts.ns[1], check=False).stdout.split()
                        for pid in pids:
                            os.kill(int(pid), 9)
                        procs[1].wait(timeout=30)
                        what = f"every process of host 1 ({len(pids)}), its tprun started again"
                        time.sleep(1)
                        procs[1] = start(1)
                    else:
                        children = sh("pgrep", "-P", str(procs[1].pid), check=False).stdout.split()
                        if children:
                            pid = int(rng.choice(children))
                            os.kill(pid, 9)
                            what = f"rank pid {pid} of host 1"
                for p in procs:
                    p.wait(timeout=TIMEOUT)
                reader.join(10)
            except subprocess.TimeoutExpired:
                pass
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.wait()
                port += 2
            out = "".join(lines)
            got = last_losses(out)
            restarts = sum(1 for line in lines if "tprun: restarting every rank" in line)
            good = (what is not None and restarts == 1 and procs[0].returncode == 0 and procs[1].returncode == 0
                    and len(got) == steps and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, want)))
            print(f"{'ok  ' if good else 'FAIL'} elastic trial {trial}: killed {what} at step >= {kill_at}; "
                  f"{restarts} restart(s); exits {procs[0].returncode}/{procs[1].returncode}; {len(got)} steps equal to "
                  f"the uninterrupted run's: {good}")
            if not good or os.environ.get("MULTIHOST_VERBOSE"):
                print("".join(line for line in lines if "tprun:" in line or "resuming" in line or "error" in line)[-4000:]
                      if good else out[-4000:])
            ok &= good
    return ok


def same(name, got, want):
    ok = len(got) == len(want) == STEPS and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, want))
    print(f"{'ok  ' if ok else 'FAIL'} {name}: two hosts {got} / one host {want}")
    return ok


def main():
    bin_dir = sys.argv[1]
    if (os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare")
            or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0):
        print("multihost_test: skipped: needs root, `ip netns` (iproute2) and `unshare` to make the namespaces")
        return 0
    hosts = Hosts()
    ok = True
    try:
        port = 29600 + os.getpid() % 300
        crossing = []  # (layout, bytes over the host link per step, median step ms)
        for name, args, nproc_one in [("DDP across hosts, TP 2 inside", ["--dp", "2", "--tp", "2", "--ddp"], 4),
                                      ("FSDP across hosts, TP 2 inside", ["--dp", "2", "--tp", "2", "--fsdp"], 4),
                                      ("TP 4 across both hosts", ["--tp", "4"], 4),
                                      # the seeds' advice: a pipeline across the hosts, TP inside each
                                      ("pp 2 across hosts, TP 2 inside", ["--pp", "2", "--tp", "2", "--pp-microbatches", "2"], 4)]:
            before = hosts.link_bytes()
            two = run_two_hosts(hosts, bin_dir, port, args)
            crossing.append((name, (hosts.link_bytes() - before) / STEPS, median_step_ms(two)))
            ok &= same(name, losses(two), losses(run_one_host(bin_dir, nproc_one, args)))
            port += 2
        print("bytes crossing the host link per step (whole run / steps: rendezvous included), median step:")
        for name, per_step, ms in crossing:
            print(f"  {name:34s} {per_step:12.0f} B/step  {ms:8.1f} ms/step")
        ok &= same("rendezvous (--rdzv-endpoint, host 1 first), DDP across hosts, TP 2 inside",
                   losses(run_two_hosts(hosts, bin_dir, port, ["--dp", "2", "--tp", "2"], rdzv=True)),
                   losses(run_one_host(bin_dir, 4, ["--dp", "2", "--tp", "2"])))
        port += 2
        with tempfile.TemporaryDirectory() as ckpt:
            whole = losses(run_one_host(bin_dir, 2, ["--tp", "2"]))
            first = losses(run_two_hosts(hosts, bin_dir, port, ["--tp", "4", "--checkpoint-dir", ckpt,
                                                                "--checkpoint-every", "3", "--stop-after", "3"]))
            rest = losses(run_one_host(bin_dir, 2, ["--tp", "2", "--checkpoint-dir", ckpt, "--resume"]))
            ok &= same("saved on 2 hosts (TP 4, steps 1-3), resumed on 1 host (TP 2, steps 4-6)", first + rest, whole)
        ok &= fail_fast(hosts, bin_dir, port + 2)  # (the checkpoint run took port)
        ok &= elastic_trials(hosts, bin_dir, port + 4, trials=int(os.environ.get("MULTIHOST_ELASTIC_TRIALS", "2")))
    finally:
        hosts.remove()
    print("summary multihost=" + ("passed" if ok else "failed"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
