"""PyTorch's parallelize_module, measured like tools/bench/tp_step_bench.cpp: one training step (forward +
backward) of an MLP under {in_proj: Colwise, out_proj: Rowwise}, minus the same step on this rank's shard
as plain tensors, minus one raw all_reduce of the output.

    .venv/bin/torchrun --standalone --nproc-per-node 2 tools/bench/tp_step_bench.py [--iters N]
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from bench_util import batched_median_us, end_process_group

BATCH, IN, HIDDEN, OUT = 8, 64, 256, 64


class Mlp(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.in_proj = nn.Linear(IN, hidden)
        self.out_proj = nn.Linear(hidden, OUT)

    def forward(self, x):
        return self.out_proj(torch.relu(self.in_proj(x)))


def step(model, x):
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    mesh = init_device_mesh("cpu", (n,))
    torch.manual_seed(0)
    x = torch.randn(BATCH, IN)
    shard = Mlp(HIDDEN // n)
    tp = parallelize_module(Mlp(HIDDEN), mesh, {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
    out = torch.randn(BATCH, OUT)

    with CommDebugMode() as comm:
        step(tp, x)
    short = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
    comms = " ".join(f"{next((s for s in short if s in str(k)), str(k))} x{v}" for k, v in comm.get_comm_counts().items())
    t_shard = batched_median_us(args.iters, lambda: step(shard, x))
    t_comm = batched_median_us(args.iters, lambda: dist.all_reduce(out))
    t_tp = batched_median_us(args.iters, lambda: step(tp, x))
    if dist.get_rank() == 0:
        print(f"# PyTorch {torch.__version__} TP step (forward + backward) of Linear({IN},{HIDDEN})-ReLU-"
              f"Linear({HIDDEN},{OUT}), batch {BATCH}, world {n}: median of 15 batches of {args.iters} steps "
              f"(us per step)")
        print(f"{'TP step':<12} {'shard step':>12} {'all_reduce':>12} {'overhead':>12}")
        print(f"{t_tp:<12.1f} {t_shard:>12.1f} {t_comm:>12.1f} {t_tp - t_shard - t_comm:>12.1f}")
        print(f"collectives per TP step: {comms or 'none'}", flush=True)
    end_process_group(0)


if __name__ == "__main__":
    main()
