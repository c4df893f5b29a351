#!/usr/bin/env python3
"""Oracle: train a toy MLP with PyTorch's own pipeline parallelism (torch.distributed.pipelining:
PipelineStage + ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B; CPU, Gloo, one process per rank)
and record losses, step-1 gradients and final parameters for the C++ pipeline runtime to compare against.

Usage:  python tests/oracle/pp_oracle.py --out DIR [--pp 2] [--schedule {GPipe,1F1B,Interleaved1F1B}]
            [--stages-per-rank 1] [--microbatches 4] [--steps 20] [--layers 8] [--dim 16] [--batch 8]
            [--lr 0.05] [--seed 0]

Data (made once in the parent, rank-independent): torch.manual_seed(seed); for layer i = 0..L-1:
W_i [D, D] = randn / sqrt(D), b_i [D] = randn * 0.1 (weight then bias, layer by layer); then inputs X [N, B, D]
= randn, targets Y [N, B, D] = randn. All float32, written to DIR/data.safetensors as "layers.{i}.weight",
"layers.{i}.bias", "inputs", "targets".
Model: layer i is y = tanh(x @ W_i^T + b_i) (nn.Linear, then tanh), the last layer has no tanh; loss =
mse_loss(out, target) (mean) per microbatch. The L layers are cut evenly into P*V stages (L % (P*V) == 0);
stage k holds layers [k*L/(P*V), (k+1)*L/(P*V)) in an nn.ModuleDict keyed by the global index (FQNs stay
"layers.{i}.weight") and lives on rank k % P (PyTorch's loop placement). Microbatches: PyTorch splits X[step] and
Y[step] along dim 0 with tensor_split (B % M == 0 required here, so it equals torch.chunk).
Training: N steps of SGD(lr) (no momentum / weight decay), zero_grad, schedule.step(...) with PyTorch's
default scale_grads=True (grads = sum over microbatches of d mse_mb / M), then opt.step().

Outputs in DIR:
  result.json         {"losses": [N] (mean of the M microbatch losses per step, float32 mean),
                       "microbatch_losses": [N][M], "step1_grads": {fqn: nested list} (after step 1's
                       schedule.step, before opt.step), "final_params": {fqn: nested list} (after N steps),
                       "executed_order": {rank: ["0F1", "2B0", ...]}: the forward_one_chunk / backward_one_chunk
                       calls each rank really made in step 1, in order ("<stage>F<microbatch>", "<stage>B<mb>"),
                       "single_process_max_loss_diff", "single_process_max_grad_diff", "config": {args},
                       "torch_version"}
  result.safetensors  "grad.<fqn>", "final.<fqn>", "losses" [N], "microbatch_losses" [N, M] (float32)
The parent then re-trains the unsplit model in one process with plain gradient accumulation (loss = mse/M per
torch.chunk microbatch, backward, then step) and reports the max abs difference of losses and step-1 grads.
Last line: "summary pp=P schedule=S microbatches=M steps=N loss0=... lossN=..."; exit 0, non-zero on error.
Bounds: Gloo timeout 60 s, workers killed after 300 s (oracle_launch.run_on_ranks).
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_launch import run_on_ranks  # noqa: E402

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B")


def make_model_class():
    import torch
    import torch.nn as nn

    class Layers(nn.Module):
        """Global layers [lo, hi) of the L-layer toy model (tanh after every layer but layer L-1)."""

        def __init__(self, lo, hi, num_layers, dim):
            super().__init__()
            self.num_layers = num_layers
            self.layers = nn.ModuleDict({str(i): nn.Linear(dim, dim) for i in range(lo, hi)})

        def forward(self, x):
            for key, lin in self.layers.items():
                x = lin(x)
                if int(key) != self.num_layers - 1:
                    x = torch.tanh(x)
            return x

    return Layers


def build(cfg, data, lo, hi):
    import torch

    model = make_model_class()(lo, hi, cfg["layers"], cfg["dim"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(data[name])
    return model


def stage_layers(cfg, k):
    per = cfg["layers"] // (cfg["pp"] * cfg["stages_per_rank"])
    return k * per, (k + 1) * per


def setup(rank):
    return None


def run_case(i, cfg, ctx, rank):
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    torch.manual_seed(cfg["seed"])
    data = load_file(os.path.join(cfg["out"], "data.safetensors"))
    P, V, M = cfg["pp"], cfg["stages_per_rank"], cfg["microbatches"]
    num_stages = P * V
    my_stages = [rank + j * P for j in range(V)]  # stage k lives on rank k % P
    mods = [build(cfg, data, *stage_layers(cfg, k)) for k in my_stages]
    stages = [PipelineStage(m, k, num_stages, device=torch.device("cpu")) for m, k in zip(mods, my_stages)]
    if cfg["schedule"] == "GPipe":
        sched = ScheduleGPipe(stages[0], n_microbatches=M, loss_fn=F.mse_loss)
    elif cfg["schedule"] == "1F1B":
        sched = Schedule1F1B(stages[0], n_microbatches=M, loss_fn=F.mse_loss)
    else:
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=M, loss_fn=F.mse_loss)
    params = [p for m in mods for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=cfg["lr"], momentum=0.0, weight_decay=0.0)
    has_first, has_last = 0 in my_stages, num_stages - 1 in my_stages
    X, Y = data["inputs"], data["targets"]
    mb_losses, grads, executed = [], {}, []
    for st in stages:
        record_calls(st, executed)
    for step in range(cfg["steps"]):
        opt.zero_grad()
        args = (X[step],) if has_first else ()
        kw = {"target": Y[step], "losses": []} if has_last else {}
        sched.step(*args, **kw)
        if has_last:
            mb_losses.append([float(l.item()) for l in kw["losses"]])
        if step == 0:
            grads = {n: p.grad.tolist() for m in mods for n, p in m.named_parameters()}
            executed = list(executed)  # step 1's calls only (the wrappers keep appending to the old list)
        opt.step()
    final = {n: p.detach().tolist() for m in mods for n, p in m.named_parameters()}
    return {"stages": my_stages, "microbatch_losses": mb_losses if has_last else None,
            "grads": grads, "final": final, "executed_order": executed}


def record_calls(stage, log):
    """Wraps stage.forward_one_chunk / backward_one_chunk to append "<stage>F<mb>" / "<stage>B<mb>" to log."""
    fwd, bwd = stage.forward_one_chunk, stage.backward_one_chunk

    def forward_one_chunk(mb, *a, **k):
        log.append(f"{stage.stage_index}F{mb}")
        return fwd(mb, *a, **k)

    def backward_one_chunk(mb, *a, **k):
        log.append(f"{stage.stage_index}B{mb}")
        return bwd(mb, *a, **k)

    stage.forward_one_chunk, stage.backward_one_chunk = forward_one_chunk, backward_one_chunk


def single_process(cfg, data):
    """The unsplit model, one process, gradient accumulation over torch.chunk(M) microbatches (loss = mse / M)."""
    import torch
    import torch.nn.functional as F

    model = build(cfg, data, 0, cfg["layers"])
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    M, losses, grads = cfg["microbatches"], [], {}
    for step in range(cfg["steps"]):
        opt.zero_grad()
        mb = []
        for x, y in zip(data["inputs"][step].chunk(M), data["targets"][step].chunk(M)):
            loss = F.mse_loss(model(x), y)
            (loss / M).backward()
            mb.append(loss.detach())
        losses.append(float(torch.stack(mb).mean().item()))
        if step == 0:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
    return losses, grads


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--schedule", choices=SCHEDULES, default="1F1B")
    ap.add_argument("--stages-per-rank", type=int, default=1)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = vars(a)
    P, V, M, L = a.pp, a.stages_per_rank, a.microbatches, a.layers
    if min(P, V, M, L, a.steps, a.dim, a.batch) < 1:
        sys.exit("pp_oracle: --pp, --stages-per-rank, --microbatches, --steps, --layers, --dim, --batch must be >= 1")
    if L % (P * V):
        sys.exit(f"pp_oracle: --layers {L} is not divisible by pp*stages-per-rank = {P * V}")
    if a.batch % M:
        sys.exit(f"pp_oracle: --batch {a.batch} is not divisible by --microbatches {M}")
    if V != 1 and a.schedule != "Interleaved1F1B":
        sys.exit(f"pp_oracle: --schedule {a.schedule} runs one stage per rank (got --stages-per-rank {V})")

    import torch
    from safetensors.torch import save_file

    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    data = {}
    for i in range(L):
        data[f"layers.{i}.weight"] = torch.randn(a.dim, a.dim) * (1.0 / math.sqrt(a.dim))
        data[f"layers.{i}.bias"] = torch.randn(a.dim) * 0.1
    data["inputs"] = torch.randn(a.steps, a.batch, a.dim)
    data["targets"] = torch.randn(a.steps, a.batch, a.dim)
    data = {k: v.float().contiguous() for k, v in data.items()}
    save_file(data, os.path.join(a.out, "data.safetensors"))

    per_rank, torch_version, timing = run_on_ranks(P, setup, run_case, [dict(cfg, id="pp")],
                                                   total_timeout_s=300, pg_timeout_s=60)
    results = [r[0] for r in per_rank]
    for r, res in enumerate(results):
        if "error" in res:
            print(f"pp_oracle: rank {r} failed: {res['error']}\n{res.get('trace', '')}", file=sys.stderr)
            sys.exit(1)
    last = results[(P * V - 1) % P]
    mb_losses = last["microbatch_losses"]
    losses = [float(torch.tensor(m).mean().item()) for m in mb_losses]
    grads, final = {}, {}
    for res in results:
        grads.update(res["grads"])
        final.update(res["final"])
    names = [n for i in range(L) for n in (f"layers.{i}.weight", f"layers.{i}.bias")]
    if sorted(grads) != sorted(names) or sorted(final) != sorted(names):
        sys.exit(f"pp_oracle: the ranks returned parameters {sorted(grads)}, expected {names}")

    ref_losses, ref_grads = single_process(cfg, data)
    loss_diff = max(abs(x - y) for x, y in zip(losses, ref_losses))
    grad_diff = max(float((torch.tensor(grads[n]) - ref_grads[n]).abs().max()) for n in names)

    doc = {"losses": losses, "microbatch_losses": mb_losses,
           "step1_grads": {n: grads[n] for n in names}, "final_params": {n: final[n] for n in names},
           "executed_order": {str(r): res["executed_order"] for r, res in enumerate(results)},
           "single_process_max_loss_diff": loss_diff, "single_process_max_grad_diff": grad_diff,
           "config": cfg, "torch_version": torch_version}
    with open(os.path.join(a.out, "result.json"), "w") as f:
        json.dump(doc, f)
    st = {}
    for n in names:
        st[f"grad.{n}"] = torch.tensor(grads[n], dtype=torch.float32).contiguous()
        st[f"final.{n}"] = torch.tensor(final[n], dtype=torch.float32).contiguous()
    st["losses"] = torch.tensor(losses, dtype=torch.float32)
    st["microbatch_losses"] = torch.tensor(mb_losses, dtype=torch.float32).contiguous()
    save_file(st, os.path.join(a.out, "result.safetensors"))
    print(f"pp_oracle: torch {torch_version}, {timing}; single-process max |loss diff| {loss_diff:.3e}, "
          f"max |step-1 grad diff| {grad_diff:.3e}")
    print(f"summary pp={P} schedule={a.schedule} microbatches={M} steps={a.steps} "
          f"loss0={losses[0]:.7g} lossN={losses[-1]:.7g}")


if __name__ == "__main__":
    main()
