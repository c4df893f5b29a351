"""PyTorch's Python DTensor, measured like tools/bench/redistribute_bench.cpp.

    .venv/bin/torchrun --nproc-per-node 2 tools/bench/redistribute_bench.py [--iters N]

Median time of DTensor.redistribute per transition and size, the median of the bare c10d collective moving
the same bytes, and the difference (the overhead).
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from bench_util import end_process_group, synchronized_median_us


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    n = dist.get_world_size()
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (n,))
    torch.manual_seed(0)
    if rank == 0:
        print(f"# PyTorch {torch.__version__} DTensor redistribute overhead: world {n}, float32, "
              f"median of {args.iters} iterations (us)")
        print(f"{'transition':<26} {'elements':>10} {'redistribute':>12} {'raw':>12} {'overhead':>12}")
    transitions = [
        ("Shard(0)->Replicate", [Shard(0)], [Replicate()]),
        ("Partial->Replicate", [Partial()], [Replicate()]),
        ("Partial->Shard(0)", [Partial()], [Shard(0)]),
        ("Shard(0)->Shard(1)", [Shard(0)], [Shard(1)]),
        ("Replicate->Shard(0)", [Replicate()], [Shard(0)]),
    ]
    for rows in (8, 256, 4096):
        cols = 64
        full = torch.randn(rows * n, cols)
        for name, src, dst in transitions:
            dt = distribute_tensor(full, mesh, src)
            ours = synchronized_median_us(args.iters, lambda: dt.redistribute(mesh, dst))
            local = dt.to_local().contiguous()
            out_full = torch.empty_like(full)
            out_shard = torch.empty(rows, cols)
            a2a_out = torch.empty_like(local)
            if name == "Shard(0)->Replicate":
                raw = lambda: dist.all_gather_into_tensor(out_full, local)
            elif name == "Partial->Replicate":
                raw = lambda: dist.all_reduce(local.clone())
            elif name == "Partial->Shard(0)":
                raw = lambda: dist.reduce_scatter_tensor(out_shard, local)
            elif name == "Shard(0)->Shard(1)":
                raw = lambda: dist.all_to_all_single(a2a_out, local)
            else:
                raw = lambda: local.narrow(0, 0, rows).clone()
            bare = synchronized_median_us(args.iters, raw)
            if rank == 0:
                print(f"{name:<26} {full.numel():>10} {ours:>12.1f} {bare:>12.1f} {ours - bare:>12.1f}", flush=True)
    end_process_group(0)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
