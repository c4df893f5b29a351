"""Llama under torchtitan's TP + SP plan with loss parallel: PyTorch's own parallelize_module vs our llama_train.

    python tests/oracle/llama_oracle.py <build/bin>              # TP 2
    python tests/oracle/llama_oracle.py <build/bin> --fsdp-2d    # FSDP2 + TP on a 2x2 ("dp", "tp") mesh (main_fsdp_2d)
    python tests/oracle/llama_oracle.py <build/bin> --mixed-precision  # bf16: autocast TP, FSDP2 mp_policy x TP
    python tests/oracle/llama_oracle.py <build/bin> --float8     # --float8 against torchao's Float8Linear at TP 2
    python tests/oracle/llama_oracle.py <build/bin> --pp         # pp 2 (1F1B, GPipe) against torch.distributed.pipelining (main_pp)

1. `llama_dump --out D ...` writes the initial weights and batches; `tprun --nproc-per-node 2 llama_train ...` trains a small config at TP 2 for 20 steps, printing every
   step's loss and its collectives (type, count, bytes), and writes its initial weights and batches to D.
2. `torchrun --standalone --nproc-per-node 2 llama_oracle.py --worker D` builds the same model in Python
   (llama_torch.py: HF names, HF's rotate-half rotary, GQA via repeat_kv, SwiGLU), loads the weights, parallelizes it
   with torchtitan's plan through PyTorch's parallelize_module, and trains on the same batches with the same
   AdamW, learning rate schedule and clipping, under loss_parallel, counting collectives with a dispatch mode.
3. Every step's loss must agree to 1e-5 relative, and forward + backward collectives per step by type and
   bytes must be equal (ours has one bucketed all-reduce of the norm gradients more; our clipping and AdamW
   then issue only the total norm's all-reduce, PyTorch's one per Partial gradient per op) (counts from PyTorch's CommDebugMode; bytes from a dispatch mode that sees the functional
   collectives). PyTorch runs attention through SDPA's math kernel: its DTensor has no rule for the CPU flash kernel.
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile

SMALL = ["--dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--ffn-dim", "128", "--seq-len", "16",
         "--batch", "4", "--steps", "20", "--lr", "3e-3", "--warmup", "5", "--max-norm", "1.0", "--seed", "11"]
FP32 = ["--mixed-precision", "off"]  # the fp32 comparisons (main, main_fsdp_2d); main_mixed_precision passes bf16
# main_pp: 4 layers, so that each of the 2 stages holds 2 (SMALL's embeddings are untied, as --pp needs).
SMALL_PP = [v if SMALL[i - 1] != "--layers" else "4" for i, v in enumerate(SMALL)]

# Collective names: PyTorch's functional collectives -> ours (dtensor::CommDebugMode).
FUNCOL = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter", "all_reduce": "all_reduce",
          "all_to_all_single": "all_to_all", "broadcast": "broadcast",
          # c10d's own ops (FSDP2 calls them directly): (output, input) for the gathers and scatters
          "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
          "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
          "allreduce": "all_reduce"}
C10D_INPUT_ARG = {"_allgather_base": 1, "_reduce_scatter_base": 1, "allgather_into_tensor_coalesced": 1,
                  "reduce_scatter_tensor_coalesced": 1}


def load_dump(dump):
    """llama_dump's files (tests/models/llama_dump.cpp): (meta, config, train options, a reader of its tensors, the
    PyTorch model (llama_torch.py) holding the dumped initial weights)."""
    import numpy as np
    import torch
    from llama_torch import build_llama

    meta = json.load(open(dump + ".json"))
    blob = open(dump + ".bin", "rb").read()
    cfg, tr = meta["config"], meta["train"]

    def tensor(entry):
        dtype = np.float32 if entry["dtype"] == "float32" else np.int64
        n = int(np.prod(entry["shape"])) if entry["shape"] else 1
        return torch.from_numpy(np.frombuffer(blob, dtype=dtype, count=n, offset=entry["offset"]).copy()).view(entry["shape"])

    model = build_llama(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensor(meta["params"][name]))
    return meta, cfg, tr, tensor, model


def optimizer_as_ours(params, tr):
    """llama_train's AdamW (its betas, eps and weight decay from the dump) and its learning rate per step."""
    import torch
    opt = torch.optim.AdamW(params, lr=tr["lr"], betas=tuple(tr["betas"]), eps=tr["eps"],
                            weight_decay=tr["weight_decay"], foreach=False)
    return opt, lr_schedule(tr)


def lr_schedule(tr):
    """llama_train's lr_at (train/step.cpp): linear warmup, then cosine decay to a tenth."""
    steps, warmup = tr["steps"], tr["warmup"]

    def lr_at(step):
        if step < warmup:
            return tr["lr"] * (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup - 1))
        return tr["lr"] * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))
    return lr_at


def worker(dump, dp=1, mp="off", float8=""):
    """dp > 1: a ("dp", "tp") mesh, TP on mesh["tp"], then FSDP2 (fully_shard per layer, then the root) on
    mesh["dp"]; each dp rank trains on its rows of the batch. mp "bf16": FSDP2's MixedPrecisionPolicy(bf16, fp32)
    with dp > 1, torch.autocast(bf16) around the forward without FSDP; the loss in fp32 either way. float8
    "tensorwise" / "rowwise": torchao's convert_to_float8_training (every Linear but lm_head) and, tensorwise, its float8
    TP styles (torchtitan's enable_float8_tensorwise_tp)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import loss_parallel
    from torch.utils._python_dispatch import TorchDispatchMode
    from llama_torch import apply_torchtitan_tp
    from peer_exit import end_process_group

    torch.set_num_threads(1)
    meta, cfg, tr, tensor, model = load_dump(dump)

    if float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(float8),
                                   module_filter_fn=lambda mod, fqn: fqn != "lm_head")
    world = int(os.environ["WORLD_SIZE"])
    if dp > 1:
        mesh2d = init_device_mesh("cpu", (dp, world // dp), mesh_dim_names=("dp", "tp"))
        mesh = mesh2d["tp"]
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    # torchao's float8 TP styles cannot run here: Gloo has no float8 all-gather ("Invalid scalar type"; ours gathers
    # the float8 bytes as uint8). torchao's layers under the plain styles compute the same (their amaxes are DTensor
    # reductions: global, as the float8 styles' are).
    apply_torchtitan_tp(model, mesh)

    class CollectiveCounter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.counts, self.bytes = {}, {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._overloadpacket.__name__
            if func.namespace in ("_c10d_functional", "c10d_functional", "c10d") and name.rstrip("_") in FUNCOL:
                ours = FUNCOL[name.rstrip("_")]
                x = args[C10D_INPUT_ARG.get(name.rstrip("_"), 0)] if func.namespace == "c10d" else args[0]
                x = x[0] if isinstance(x, (list, tuple)) else x
                self.counts[ours] = self.counts.get(ours, 0) + 1
                self.bytes[ours] = self.bytes.get(ours, 0) + x.numel() * x.element_size()
            return func(*args, **(kwargs or {}))

    if dp > 1:
        from torch.distributed.fsdp import fully_shard

        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mp == "bf16" \
            else MixedPrecisionPolicy()
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh2d["dp"], mp_policy=policy)
        fully_shard(model, mesh=mesh2d["dp"], mp_policy=policy)
    import contextlib
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if mp == "bf16" and dp == 1 else contextlib.nullcontext
    params = list(model.parameters())
    opt, lr_at = optimizer_as_ours(params, tr)
    steps = tr["steps"]

    rank = dist.get_rank()
    import resource
    import time
    for step in range(steps):
        started = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        batch = meta["batches"][step]
        inputs, labels = tensor(batch["inputs"]), tensor(batch["labels"])
        if dp > 1:  # this dp rank's rows of the global batch
            rows = inputs.shape[0] // dp
            i = mesh2d.get_local_rank("dp")
            inputs, labels = inputs[i * rows:(i + 1) * rows], labels[i * rows:(i + 1) * rows]
        opt.zero_grad()
        counter, comm_mode = CollectiveCounter(), CommDebugMode()
        with comm_mode, counter, loss_parallel():
            with autocast():
                logits = model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))
            loss.backward()
        update_mode = CommDebugMode()
        with update_mode:
            torch.nn.utils.clip_grad_norm_(params, tr["max_norm"], foreach=False)
            opt.step()
        value = loss.full_tensor().item() if hasattr(loss, "full_tensor") else loss.item()
        if dp > 1:  # the global batch's mean: the dp ranks' means averaged
            v = torch.tensor([value], dtype=torch.float64)
            dist.all_reduce(v, group=mesh2d["dp"].get_group())
            value = v.item() / dp
        if rank == 0:
            # Counts from PyTorch's CommDebugMode; bytes from the counter above where it saw the collective.
            counts = {}
            for k, n in comm_mode.get_comm_counts().items():  # functional and c10d spellings of one collective add up
                name = FUNCOL.get(str(k).split(".")[-1].rstrip("_"), str(k))
                counts[name] = counts.get(name, 0) + n
            comm = " ".join(f"{c}={n}:{counter.bytes.get(c, '?')}" for c, n in sorted(counts.items()))
            ms = (time.perf_counter() - started) * 1000.0
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
            print(f"step {step + 1} loss {value:.6f} update {update_mode.get_total_counts()} comm {comm} | "
                  f"ms {ms:.1f} peak_rss_mb {rss:.0f}", flush=True)
    end_process_group(0)


def worker_pp(dump, schedule, microbatches):
    """Pipeline parallelism the torchtitan way through torch.distributed.pipelining, world 2 = pp 2 (Gloo, CPU):
    the llama_torch model loaded from the dump and cut into 2 stages, one per rank (torchtitan's even split: stage k
    holds layers [k*L/2, (k+1)*L/2); stage 0 also embed_tokens, stage 1 model.norm and lm_head; each stage computes
    the rotary tables itself, as llama_torch's Body does), each a PipelineStage under ScheduleGPipe / Schedule1F1B
    with `microbatches` microbatches (PyTorch splits the batch along dim 0 with tensor_split) and its default
    scale_grads (the accumulated grads divided by M after the last backward; ours scales each microbatch's loss by
    1/M: the same in fp32, M a power of two). Loss per microbatch: cross entropy of the flattened fp32 logits, mean
    over its tokens. Clipping as torchtitan's clip_grad_norm_ with a pp mesh: each stage's total norm squared,
    all-reduced over the pp group, its sqrt; grads scaled by min(1, max_norm / (total + 1e-6)). Then each rank's
    AdamW over its own stage's parameters, the lr schedule of `worker`. Rank 0 prints the last stage's mean of the
    microbatch losses per step in `worker`'s line format (no collectives counted: "update 0 comm - |")."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    from peer_exit import end_process_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    meta, cfg, tr, tensor, model = load_dump(dump)
    L = cfg["num_hidden_layers"]
    if L % world:
        raise SystemExit(f"worker_pp: {L} layers do not split evenly into {world} stages")
    lo, hi = rank * L // world, (rank + 1) * L // world
    first, last = rank == 0, rank == world - 1
    hd = cfg["hidden_size"] // cfg["num_attention_heads"]

    class Stage(nn.Module):
        """Layers [lo, hi) of `model`, with embed_tokens on the first stage and norm + lm_head on the last."""

        def __init__(self):
            super().__init__()
            self.embed_tokens = model.model.embed_tokens if first else None
            self.layers = nn.ModuleList(model.model.layers[lo:hi])
            self.norm = model.model.norm if last else None
            self.lm_head = model.lm_head if last else None

        def forward(self, x):
            h = self.embed_tokens(x) if first else x
            s = h.shape[1]  # llama_torch's Body: positions 0..s-1, HF's rotate-half tables
            inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
            freqs = torch.outer(torch.arange(s, dtype=torch.float32), inv_freq)
            angles = torch.cat((freqs, freqs), dim=-1)
            cos, sin = angles.cos().to(h.dtype), angles.sin().to(h.dtype)
            for layer in self.layers:
                h = layer(h, cos, sin)
            return self.lm_head(self.norm(h)) if last else h

    stage_module = Stage()
    stage = PipelineStage(stage_module, stage_index=rank, num_stages=world, device=torch.device("cpu"))

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))

    kind = {"GPipe": ScheduleGPipe, "1F1B": Schedule1F1B}[schedule]
    sched = kind(stage, n_microbatches=microbatches, loss_fn=loss_fn)
    params = list(stage_module.parameters())
    opt, lr_at = optimizer_as_ours(params, tr)
    steps = tr["steps"]

    import resource
    import time
    for step in range(steps):
        started = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        batch = meta["batches"][step]
        inputs, labels = tensor(batch["inputs"]), tensor(batch["labels"])
        opt.zero_grad()
        losses = []
        if first:
            sched.step(inputs)
        else:
            sched.step(target=labels, losses=losses)
        # torchtitan's clip_grad_norm_ with pp_mesh: the stages' norms squared, summed over the pp group.
        grads = [p.grad for p in params if p.grad is not None]
        total = torch.nn.utils.get_total_norm(grads, 2.0, foreach=False) ** 2
        dist.all_reduce(total)
        total = total.sqrt()
        torch.nn.utils.clip_grads_with_norm_(params, tr["max_norm"], total, foreach=False)
        opt.step()
        # The step's loss: the last stage's mean of its microbatch losses, summed over ranks (the others add 0).
        value = torch.tensor([torch.stack([l.detach() for l in losses]).mean().item() if last else 0.0],
                             dtype=torch.float64)
        dist.all_reduce(value)
        if rank == 0:
            ms = (time.perf_counter() - started) * 1000.0
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
            print(f"step {step + 1} loss {value.item():.6f} update 0 comm - | ms {ms:.1f} peak_rss_mb {rss:.0f} "
                  f"pp {world} {schedule} microbatches {microbatches} grad_norm {total.item():.6f}", flush=True)
    end_process_group(0)


def parse_ours(text):
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([-0-9.e]+)", text)]
    rows = re.findall(r"comm step \d+ fwd_bwd([^|]*)\| update(.*)", text)
    update = [sum(int(e.split("=")[1].split(":")[0]) for e in u.split()) for _, u in rows]
    return losses, [" ".join(sorted(c.split())) for c, _ in rows], update


def parse_theirs(text):
    rows = re.findall(r"step \d+ loss ([-0-9.e]+) update (\d+) comm ([^|]*?) *\|", text)
    return [float(l) for l, _, _ in rows], [" ".join(sorted(c.split())) for _, _, c in rows], [int(u) for _, u, _ in rows]


def write_dump(bin_dir, dump, train_args):
    """llama_dump (tests/models/llama_dump.cpp): the initial weights and every batch of llama_train with
    `train_args`, into dump.bin / dump.json, for the PyTorch worker."""
    out = subprocess.run([os.path.join(bin_dir, "llama_dump"), "--out", dump, *train_args], capture_output=True,
                         text=True, timeout=600)
    if out.returncode != 0:
        sys.exit(f"llama_dump failed:\n{out.stdout}\n{out.stderr}")


def run_both(bin_dir, nproc, our_args, worker_args, timeout, base=SMALL, worker_flag="--worker"):
    """Our llama_train under tprun and this file's PyTorch worker under torchrun, on the weights and batches
    our run dumps: (our stdout, PyTorch's stdout). base: the config (SMALL; main_pp's SMALL_PP); worker_flag:
    "--worker" (worker) or "--worker-pp" (worker_pp)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        dump = os.path.join(tmp, "llama")
        write_dump(bin_dir, dump, [*base, *our_args])
        ours = run_ours(bin_dir, nproc, [*our_args, "--log-every", "1", "--comm-detail"], timeout, base)
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        # TMPDIR: torchrun's torchelastic_* folders go with this temporary directory
        ref = subprocess.run([torchrun, "--standalone", "--nproc-per-node", str(nproc), os.path.abspath(__file__),
                              worker_flag, dump, *worker_args], env=dict(env, TMPDIR=tmp), capture_output=True, text=True,
                             timeout=timeout)
        if ref.returncode != 0:
            sys.exit(f"PyTorch run failed:\n{ref.stdout}\n{ref.stderr}")
    return ours, ref.stdout


def run_ours(bin_dir, nproc, our_args, timeout, base=SMALL):
    """Our llama_train alone under tprun (base, SMALL by default, and our_args): its stdout."""
    ours = subprocess.run([os.path.join(bin_dir, "tprun"), "--nproc-per-node", str(nproc), "--master-port", "0",
                           "llama_train", *base, *our_args], env=dict(os.environ, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=timeout)
    if ours.returncode != 0:
        sys.exit(f"llama_train failed:\n{ours.stdout}\n{ours.stderr}")
    return ours.stdout


def scaled_mm_is_the_emulation():
    """Whether this CPU's torch._scaled_mm equals PyTorch's dequantizing fallback bit for bit (float8 widened to fp32
    and multiplied by the inverse scales, an fp32 mm): the fallback itself, not oneDNN's float8 matmul."""
    import torch
    # Sums long enough, and scales odd enough, that fp32 rounds them (at K = 128 and scales 1/2, 1/4 the sums are
    # exact in any order, and oneDNN's equal the fallback's).
    g = torch.Generator().manual_seed(0)
    a = (3 * torch.randn(32, 1024, generator=g)).to(torch.float8_e4m3fn)
    b = (3 * torch.randn(32, 1024, generator=g)).to(torch.float8_e4m3fn).t()
    inv_a, inv_b = torch.tensor(0.37), torch.tensor(0.0113)
    got = torch._scaled_mm(a, b, inv_a, inv_b, out_dtype=torch.float32)
    return torch.equal(got, torch.mm(a.float() * inv_a, b.float() * inv_b))


def check_losses(a, b, header):
    """Prints both curves; exits unless both have 20 steps equal to 1e-5 relative."""
    print(header)
    for i, (x, y) in enumerate(zip(a, b)):
        print(f"{i + 1:4d}  {x:.6f}          {y:.6f}")
    if len(a) != 20 or len(b) != 20:
        sys.exit(f"expected 20 losses each, got {len(a)} and {len(b)}")
    bad = [i + 1 for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > 1e-5 * abs(x)]
    if bad:
        sys.exit(f"losses differ at steps {bad}")


def main():
    if sys.argv[1] == "--worker":
        return worker(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1, sys.argv[4] if len(sys.argv) > 4 else "off",
                      sys.argv[5] if len(sys.argv) > 5 else "")
    if len(sys.argv) > 2 and sys.argv[2] == "--fsdp-2d":
        return main_fsdp_2d(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--mixed-precision":
        return main_mixed_precision(sys.argv[1])
    if sys.argv[1] == "--worker-pp":
        return worker_pp(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    if len(sys.argv) > 2 and sys.argv[2] == "--float8":
        return main_float8(sys.argv[1])
    if len(sys.argv) > 2 and sys.argv[2] == "--pp":
        return main_pp(sys.argv[1])
    ours, theirs = run_both(sys.argv[1], 2, FP32, [], 600)
    a, ca, ua = parse_theirs(theirs)
    b, cb, ub = parse_ours(ours)
    check_losses(a, b, "step  PyTorch TP+SP      dtensor-cpp TP+SP")
    print("collectives per step (forward + backward), PyTorch:", ca[:1], " ours:", cb[:1])

    def same_collectives(theirs, ours):
        # "all_gather=10:81920 all_reduce=3:? ...": counts must agree for every type; bytes where PyTorch's are
        # known (its loss_parallel all-reduces bypass the functional collectives the byte counter sees). Ours
        # has one all-reduce more: the bucket of the norm weights' Partial gradients (gradient_sync.h), which
        # PyTorch leaves Partial and reduces in every optimizer op instead.
        t = dict(e.split("=") for e in theirs.split())
        o = dict(e.split("=") for e in ours.split())
        if t.keys() != o.keys():
            return False
        for k in t:
            (tn, tb), (on, ob) = t[k].split(":"), o[k].split(":")
            if k == "all_reduce":
                if int(on) != int(tn) + 1:
                    return False
            elif tn != on or (tb != "?" and tb != ob):
                return False
        return True

    def total(comm):
        return sum(int(e.split("=")[1].split(":")[0]) for e in comm.split())

    print(f"whole step collectives (forward, backward, clipping, AdamW): PyTorch {total(ca[0]) + ua[0]}, "
          f"dtensor-cpp {total(cb[0]) + ub[0]}")
    # Ours: the plan's forward + backward, the gradient bucket, the total norm; nothing else.
    if ub != [1] * len(ub) or any(total(ours) != total(theirs) + 1 for theirs, ours in zip(ca, cb)):
        sys.exit(f"our whole step is not the plan's count: update {ub}, forward+backward {cb[:1]} vs PyTorch's {ca[:1]}")

    diff = [i + 1 for i, (x, y) in enumerate(zip(ca, cb)) if not same_collectives(x, y)]
    if diff or len(ca) != len(cb):
        sys.exit(f"collectives differ at steps {diff}: PyTorch {ca[diff[0] - 1] if diff else ca} vs ours "
                 f"{cb[diff[0] - 1] if diff else cb}")
    print("Llama TP+SP losses and collectives match PyTorch's parallelize_module")


def main_fsdp_2d(bin_dir):
    """dp 2 x tp 2 (world 4): our llama_train --dp 2 --tp 2 --fsdp against PyTorch's fully_shard +
    parallelize_module on the same weights and batches: every step's loss (1e-5 relative) and the forward +
    backward collectives by type and bytes."""
    ours, theirs = run_both(bin_dir, 4, ["--dp", "2", "--tp", "2", "--fsdp", *FP32], ["2"], 900)
    a, ca, _ = parse_theirs(theirs)
    b, cb, _ = parse_ours(ours)
    check_losses(a, b, "step  PyTorch FSDP2+TP   dtensor-cpp FSDP+TP   (dp 2 x tp 2)")
    print("collectives per step (forward + backward), PyTorch:", ca[:1])
    print("                                            ours:", cb[:1])

    def by_type(comm):
        return {k: v.split(":") for k, v in (e.split("=") for e in comm.split())}

    for step, (theirs, mine) in enumerate(zip(ca, cb), 1):
        t, o = by_type(theirs), by_type(mine)
        # FSDP's gathers (root once, each layer before forward and again before backward) and reduce-scatters
        # (one per module) with TP's: counts and bytes. All-reduces (loss parallel's 3, each sequence-parallel
        # norm gradient's Partial -> Replicate over tp): counts (PyTorch's loss-parallel bytes are not seen).
        for kind in ("all_gather", "reduce_scatter"):
            if t.get(kind) != o.get(kind):
                sys.exit(f"step {step}: {kind} differs: PyTorch {t.get(kind)} vs ours {o.get(kind)}")
        if t.get("all_reduce", ["0"])[0] != o.get("all_reduce", ["0"])[0] or t.keys() != o.keys():
            sys.exit(f"step {step}: collectives differ: PyTorch {theirs} vs ours {mine}")
    print("Llama FSDP+TP (dp 2 x tp 2) losses and collectives match PyTorch's fully_shard + parallelize_module")


def worst_difference(a, b, header, name):
    """Prints both 20-step curves under `header`; exits unless both have 20 steps; the largest relative difference."""
    print(header)
    for i, (x, y) in enumerate(zip(a, b)):
        print(f"{i + 1:4d}  {x:.6f}          {y:.6f}")
    if len(a) != 20 or len(b) != 20:
        sys.exit(f"{name}: expected 20 losses each, got {len(a)} and {len(b)}")
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


def main_mixed_precision(bin_dir):
    """llama_train's default precision (fp32 masters, bf16 compute, fp32 reductions) against PyTorch's two recipes on
    the same weights and batches, 20 steps each: TP 2 against torch.autocast(bf16) over parallelize_module, and
    dp 2 x tp 2 (FSDP) against fully_shard(mp_policy=MixedPrecisionPolicy(bf16, fp32)) + parallelize_module. The
    recipes round differently (autocast keeps norms and elementwise ops in fp32; FSDP2 and ours compute all of the
    forward in bf16), so the losses agree within MP_BOUND, not bit for bit; each recipe's fp32 run agrees to 1e-5
    (main, main_fsdp_2d)."""
    mp = ["--mixed-precision", "bf16"]
    worst = {}
    for name, nproc, ours_args, worker_args in [("TP 2 vs autocast", 2, [], ["1", "bf16"]),
                                                ("FSDP 2 x TP 2 vs MixedPrecisionPolicy", 4,
                                                 ["--dp", "2", "--tp", "2", "--fsdp"], ["2", "bf16"])]:
        ours, theirs = run_both(bin_dir, nproc, ours_args + mp, worker_args, 900)
        a, _, _ = parse_theirs(theirs)
        b, _, _ = parse_ours(ours)
        worst[name] = worst_difference(a, b, f"step  PyTorch bf16      dtensor-cpp bf16   ({name})", name)
        print(f"{name}: max relative loss difference {worst[name]:.2e} (bound {MP_BOUND})")
    bad = {k: v for k, v in worst.items() if v > MP_BOUND}
    if bad:
        sys.exit(f"mixed-precision losses differ beyond {MP_BOUND}: {bad}")
    print("Llama mixed-precision losses agree with PyTorch's autocast TP and FSDP2 MixedPrecisionPolicy x TP")


def main_float8(bin_dir):
    """llama_train --float8 against torchao's Float8Linear (convert_to_float8_training, every Linear but lm_head) on the
    same weights and batches at TP 2, in fp32 compute (--mixed-precision off) so that the float8 quantization is all
    that differs from fp32. torchao runs under the plain styles (Gloo has no float8 all-gather for its float8 styles);
    ours under its float8 styles (tensorwise) or the plain ones (rowwise). Losses over 20 steps within FLOAT8_BOUND;
    our tensorwise all-gathers carry a quarter of torchao's fp32 bytes for the blocks' activations (4 per layer) and
    the same for the embedding's and lm_head's (2)."""
    worst = {}
    # torchao's matmul is this CPU's torch._scaled_mm. Where that is PyTorch's dequantizing fallback, our `emulated`
    # sums exactly as it does and auto (the default) runs; where it is oneDNN's float8 matmul (Intel AMX machines:
    # other sums' order), only our `scaled_mm` computes torchao's numbers, so it runs, and auto's choice is checked
    # in a run of its own.
    exact = scaled_mm_is_the_emulation()
    kind = "PyTorch's dequantizing fallback" if exact else "not the fallback (oneDNN's)"
    print(f"this CPU's torch._scaled_mm is {kind}: ours with --float8-matmul {'auto' if exact else 'scaled_mm'}")
    for recipe in ("tensorwise", "rowwise"):
        args = [*FP32, "--float8", "--float8-recipe", recipe]
        ours, theirs = run_both(bin_dir, 2, args + ([] if exact else ["--float8-matmul", "scaled_mm"]),
                                ["1", "off", recipe], 900)
        # --float8-matmul auto: the kinds timed at start, the fastest named in the first line ("~": estimated from a
        # probe); in fp32 compute only the fp32-exact ones (scaled_mm, emulated) are candidates.
        first = ours if exact else run_ours(bin_dir, 2, [*args, "--steps", "1"], 900)
        chosen = re.search(r"float8_matmul=auto: (\S+) \(scaled_mm ~?[0-9.]+ ms, emulated ~?[0-9.]+ ms, emulated_bf16 inf ms\)",
                           first)
        if not chosen or chosen.group(1) not in ("scaled_mm", "emulated"):
            sys.exit(f"{recipe}: the first line does not name an fp32-exact float8 matmul:\n{first[:600]}")
        print(f"{recipe}: float8 matmul chosen: {chosen.group(0)}")
        a, ca, _ = parse_theirs(theirs)
        b, cb, _ = parse_ours(ours)
        worst[recipe] = worst_difference(a, b, f"step  torchao float8      dtensor-cpp float8   ({recipe}, TP 2)", recipe)
        print(f"{recipe}: max relative loss difference {worst[recipe]:.2e} (bound {FLOAT8_BOUND[recipe]})")
        def gathers(comm):
            count, nbytes = dict(e.split("=") for e in comm.split()).get("all_gather", "0:0").split(":")
            return int(count), nbytes
        (tn, tb), (on, ob) = gathers(ca[0]), gathers(cb[0])
        print(f"{recipe}: all_gathers per step (count, bytes): torchao {tn}, {tb}; ours {on}, {ob}")
        if tn != on:
            sys.exit(f"{recipe}: all-gather counts differ: torchao {tn}, ours {on}")
        if tb != "?":
            per = int(tb) // tn  # each all-gather moves b x s x h fp32 values
            want = int(tb) if recipe == "rowwise" else (tn - 2) * per // 4 + 2 * per
            if int(ob) != want:
                sys.exit(f"{recipe}: our all-gathers moved {ob} bytes, expected {want} (torchao's fp32: {tb})")
    bad = {k: v for k, v in worst.items() if v > FLOAT8_BOUND[k]}
    if bad:
        sys.exit(f"float8 losses differ beyond {FLOAT8_BOUND}: {bad}")
    print("Llama float8 losses and all-gathers agree with torchao's Float8Linear and float8 TP styles")


def main_pp(bin_dir):
    """Pipeline parallelism, pp 2 (world 2), fp32: our llama_train --pp 2 on SMALL_PP (4 layers, 2 per stage) against
    worker_pp (torch.distributed.pipelining's PipelineStage per rank under the same schedule, torchtitan's clipping
    across stages) on the same weights and batches, two cases: 1F1B with 2 microbatches and GPipe with 4 (the batch of
    4 cut along dim 0). Every step's loss (the mean of the microbatch losses) to 1e-5 relative."""
    batch = int(SMALL_PP[SMALL_PP.index("--batch") + 1])
    worst, bad = {}, {}
    for schedule, m in [("1F1B", 2), ("GPipe", 4)]:
        if batch % m:
            print(f"{schedule} with {m} microbatches skipped: the batch of {batch} does not divide")
            continue
        name = f"{schedule}, {m} microbatches"
        ours, theirs = run_both(bin_dir, 2, [*FP32, "--pp", "2", "--pp-schedule", schedule, "--pp-microbatches", str(m)],
                                [schedule, str(m)], 900, base=SMALL_PP, worker_flag="--worker-pp")
        a, _, _ = parse_theirs(theirs)
        b, _, _ = parse_ours(ours)
        worst[name] = worst_difference(a, b, f"step  PyTorch pipelining   dtensor-cpp pp   (pp 2, {name})", name)
        print(f"pp 2, {name}: max relative loss difference {worst[name]:.2e} (bound 1e-5)")
        steps = [i + 1 for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > 1e-5 * abs(x)]
        if steps:
            bad[name] = steps
    if bad:
        sys.exit(f"pipeline-parallel losses differ from PyTorch's beyond 1e-5 relative at steps {bad}")
    if not worst:
        sys.exit("pipeline-parallel oracle: no case ran")
    print("Llama pp 2 losses (1F1B, GPipe) match torch.distributed.pipelining's PipelineStage + schedules")


# llama_train --float8 against torchao over 20 steps (main_float8), every run deterministic. Tensorwise: measured 2.7e-7,
# fp32's rounding (the same float8 values and scales); the bound is the fp32 oracles' 1e-5. Rowwise: measured 3.3e-4
# (the first step's loss agrees to 5e-7; the rounding of the power-of-two row scales' products then drifts); bound 3e-3.
FLOAT8_BOUND = {"tensorwise": 1e-5, "rowwise": 3e-3}


# Ours against PyTorch's recipes over 20 steps in bf16 (main_mixed_precision): measured 5.2e-4 against autocast TP 2,
# 3.9e-4 against FSDP2's MixedPrecisionPolicy x TP (bf16 against fp32 itself: 3.9e-4); every run is deterministic (one
# thread per rank, fixed reduction orders). The bound is 10x the larger.
MP_BOUND = 5e-3


if __name__ == "__main__":
    main()
