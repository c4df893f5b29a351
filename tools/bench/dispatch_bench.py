"""PyTorch's Python DTensor, measured like tools/bench/dispatch_bench.cpp.

    .venv/bin/torchrun --standalone --nproc-per-node 2 tools/bench/dispatch_bench.py [--iters N]
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from bench_util import batched_median_us, end_process_group


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    dist.init_process_group("cpu:gloo,cuda:nccl" if args.device == "cuda" else "gloo")
    n = dist.get_world_size()
    mesh = init_device_mesh(args.device, (n,))
    a = distribute_tensor(torch.randn(64 * n), mesh, [Shard(0)])
    b = distribute_tensor(torch.randn(64 * n), mesh, [Shard(0)])
    m = distribute_tensor(torch.randn(8 * n, 8), mesh, [Shard(0)])
    w = distribute_tensor(torch.randn(8, 8), mesh, [Replicate()])
    la, lb, lm, lw = a.to_local(), b.to_local(), m.to_local(), w.to_local()
    cases = [
        ("add (Shard(0) + Shard(0), 64 elems/rank)", lambda: a + b, lambda: la + lb),
        ("mul", lambda: a * b, lambda: la * lb),
        ("relu", lambda: torch.relu(a), lambda: torch.relu(la)),
        ("sum(dim) of Shard(0) rows, dim 1", lambda: m.sum(1), lambda: lm.sum(1)),
        ("mm Shard(0) x Replicate", lambda: torch.mm(m, w), lambda: torch.mm(lm, lw)),
        ("view", lambda: m.view(-1), lambda: lm.view(-1)),
        ("t", lambda: w.t(), lambda: lw.t()),
        ("detach", lambda: a.detach(), lambda: la.detach()),
    ]
    if dist.get_rank() == 0:
        print(f"# PyTorch {torch.__version__} DTensor dispatch overhead on {args.device}: world {n}, median of 15 batches of "
              f"{args.iters} calls (us per call)")
        print(f"{'op':<42} {'DTensor':>10} {'local':>10} {'overhead':>10}")
    for name, dt, local in cases:
        t_dt, t_local = batched_median_us(args.iters, dt), batched_median_us(args.iters, local)
        if dist.get_rank() == 0:
            print(f"{name:<42} {t_dt:>10.2f} {t_local:>10.2f} {t_dt - t_local:>10.2f}", flush=True)
    end_process_group(0)


if __name__ == "__main__":
    main()
