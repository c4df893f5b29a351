"""PyTorch's torch.distributed.checkpoint on the other side of our checkpoints (tests/checkpoint/test_checkpoint_interop.cpp).

    python -m torch.distributed.run --standalone --nproc-per-node N dcp_interop.py load CKPT REF
        Loads CKPT (written by dtensor::checkpoint::save) with dcp.load + HuggingFaceStorageReader into DTensors
        on a 1-D mesh of N ranks (placements cycling Shard(0), Shard(last), Replicate; 0-d tensors plain), and
        checks every value bit-identical (torch.equal) to REF, a plain safetensors file of the full values.
    python -m torch.distributed.run --standalone --nproc-per-node N dcp_interop.py save CKPT REF
        Saves a fixed state (DTensors: Shard(0), Shard(1), Replicate; bf16, int64, a 0-d step) with dcp.save +
        HuggingFaceStorageWriter(save_distributed=True), and writes REF with the full values for the C++ side.
Exit status 0 when everything matches; 1 with one line per mismatch otherwise.
"""
import sys


def main():
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file, save_file
    from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from peer_exit import end_process_group

    mode, ckpt, ref_path = sys.argv[1:4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))

    if mode == "save":
        g = torch.Generator().manual_seed(1234)
        full = {
            "a.weight": torch.randn(7, 5, generator=g),
            "b.bias": torch.randn(6, generator=g),
            "c.weight": torch.randn(5, 9, generator=g).to(torch.bfloat16),
            "ids": torch.arange(10, dtype=torch.int64) * 3 + 1,
            "state.a.weight.step": torch.tensor(12.0),
            "state.a.weight.exp_avg": torch.randn(7, 5, generator=g),
        }
        placements = {"a.weight": [Shard(0)], "b.bias": [Replicate()], "c.weight": [Shard(1)], "ids": [Shard(0)],
                      "state.a.weight.exp_avg": [Shard(0)]}
        state = {k: (distribute_tensor(v, mesh, placements[k]) if k in placements else v.clone()) for k, v in full.items()}
        dcp.save(state, storage_writer=HuggingFaceStorageWriter(ckpt, save_distributed=True))
        if rank == 0:
            save_file(full, ref_path)
        end_process_group(0)

    ref = load_file(ref_path)
    cycle = [lambda t: [Shard(0)], lambda t: [Shard(t.dim() - 1)], lambda t: [Replicate()]]
    state = {}
    for i, (name, v) in enumerate(sorted(ref.items())):
        zeros = torch.zeros_like(v)
        state[name] = zeros if v.dim() == 0 else distribute_tensor(zeros, mesh, cycle[i % 3](v))
    dcp.load(state, storage_reader=HuggingFaceStorageReader(ckpt))
    bad = []
    for name, v in sorted(ref.items()):
        got = state[name].full_tensor() if hasattr(state[name], "full_tensor") else state[name]
        if got.dtype != v.dtype or not torch.equal(got, v):
            bad.append(f"{name}: loaded {got.dtype} {list(got.shape)} differs from the reference")
    if rank == 0:
        for line in bad:
            print("mismatch:", line)
        print(f"dcp_interop load world={world} tensors={len(ref)} mismatches={len(bad)}")
    end_process_group(1 if bad else 0)


if __name__ == "__main__":
    main()
