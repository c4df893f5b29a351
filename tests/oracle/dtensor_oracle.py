#!/usr/bin/env python3
"""Oracle: run PyTorch's own DTensor (world size 4, CPU/Gloo) on a fixed set of
cases and dump every rank's local tensors as JSON.

Usage:  python tests/oracle/dtensor_oracle.py out.json

Top-level JSON: {"torch_version", "world_size": 4, "conventions": {...}, "cases": [...]}.
Each case (see `generate_cases` / `run_case`):
  id, mesh_shape, shape, src, dst            placements as PyTorch reprs
  src_mode      "distribute": src = distribute_tensor(input, mesh, src, src_data_rank=...)
                "from_local": src = DTensor.from_local(src_local[rank], mesh, src, run_check=...,
                              shape/stride given iff from_local_pass_shape)
  src_data_rank 0 / 1 / 3 / null  (distribute mode only)
  rank_input_offset  input on global rank r is  base + rank_input_offset * r
                     (base = arange(numel).reshape(shape) * 0.25 - 1.0, float32)
  run_check, from_local_pass_shape, from_local_delta (from_local mode)
  error         present iff building src or redistribute raised: "<Type>: <message>"
  stage         where the error happened ("src" / "redistribute")
  full          dst.full_tensor() on rank 0 ({"shape","values"}) when it worked
  pytorch_wrong_value  present (true) iff PyTorch's full_tensor of dst or of a _StridedShard src is not the
                input (PyTorch 2.14 gathers some _StridedShard layouts wrongly); the replay then checks values
  ranks[r]:  src_local, dst_local, src_placements (actual, normalised), dst_placements,
             src_meta / dst_meta = compute_local_shape_and_global_offset(global, mesh, placements)
             inferred_global_shape = compute_global_tensor_info(src_local, mesh, src placements)[0]
             grad_out = upstream grad fed to dst.to_local().backward(...)
             src_grad = gradient arriving at the source ({"shape","values"} + "placements" for
                        distribute mode, where it is the leaf DTensor's .grad; for from_local mode it is
                        the plain local tensor's .grad), or backward_error.

The processes are spawned and joined by oracle_launch.run_on_ranks (shared with tp_styles_oracle.py).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_launch import error_text, run_on_ranks  # noqa: E402

WORLD_SIZE = 4

# ----------------------------------------------------------------------------
# placements as strings
# ----------------------------------------------------------------------------


def S(d):
    return f"Shard(dim={d})"


R = "Replicate()"


def P(op="sum"):
    return f"Partial({op})"


def parse_placement(s):
    from torch.distributed.tensor import Partial, Replicate, Shard

    if s == "Replicate()":
        return Replicate()
    if s.startswith("Shard(dim="):
        return Shard(int(s[len("Shard(dim="):-1]))
    if s.startswith("Partial("):
        return Partial(s[len("Partial("):-1])
    if s.startswith("_StridedShard(dim="):
        from torch.distributed.tensor.placement_types import _StridedShard

        dim, sf = s[len("_StridedShard(dim="):-1].split(", sf=")
        return _StridedShard(int(dim), split_factor=int(sf))
    raise ValueError(s)


def SS(d, sf):
    return f"_StridedShard(dim={d}, sf={sf})"


# ----------------------------------------------------------------------------
# case list
# ----------------------------------------------------------------------------

SHAPES = {
    0: [()],
    1: [(1,), (2,), (3,), (4,), (5,), (7,), (8,), (0,)],
    2: [(4, 4), (5, 3), (2, 7), (3, 1), (8, 2), (0, 3), (6, 5), (1, 2), (3, 0)],
    3: [(2, 3, 5), (4, 1, 3), (3, 4, 2), (5, 2, 2), (1, 6, 3)],
}


def _case(mesh_shape, shape, src, dst, *, src_data_rank=0, offset=0.0, mode="distribute",
          run_check=False, pass_shape=True, delta="partial", tag=""):
    c = {
        "mesh_shape": list(mesh_shape),
        "shape": list(shape),
        "src": list(src),
        "dst": list(dst),
        "src_mode": mode,
        "src_data_rank": src_data_rank,
        "rank_input_offset": offset,
    }
    if mode == "from_local":
        c["run_check"] = run_check
        c["from_local_pass_shape"] = pass_shape
        c["from_local_delta"] = delta
    if tag:
        c["tag"] = tag
    return c


def _hand_cases():
    H = []
    a = H.append
    m1, m2 = (4,), (2, 2)
    # --- 1-D mesh basics, even and uneven, dims smaller than mesh, empty shards
    for shape in [(8,), (5,), (7,), (2,), (1,), (0,)]:
        for src, dst in [([S(0)], [R]), ([R], [S(0)]), ([P()], [R]), ([P()], [S(0)]),
                         ([S(0)], [P()]), ([R], [P()]), ([R], [P("avg")]), ([S(0)], [S(0)])]:
            a(_case(m1, shape, src, dst, tag="1d-basic"))
    # Shard(i) -> Shard(j) (all-to-all), uneven on both dims
    for shape in [(4, 4), (5, 3), (2, 7), (3, 1), (6, 5), (0, 3), (3, 0)]:
        a(_case(m1, shape, [S(0)], [S(1)], tag="s2s"))
        a(_case(m1, shape, [S(1)], [S(0)], tag="s2s"))
    a(_case(m1, (2, 3, 5), [S(2)], [S(0)], tag="s2s"))
    a(_case(m1, (5, 2, 2), [S(0)], [S(2)], tag="s2s"))
    # negative dims
    a(_case(m1, (3, 5), [S(-1)], [R], tag="negdim"))
    a(_case(m1, (3, 5), [R], [S(-1)], tag="negdim"))
    a(_case(m1, (3, 5), [S(-2)], [S(-1)], tag="negdim"))
    a(_case(m2, (2, 3, 5), [S(-1), S(-3)], [S(0), R], tag="negdim"))
    # 0-d tensor
    for src, dst in [([R], [P()]), ([P()], [R]), ([R], [R]), ([R], [S(0)]), ([S(0)], [R])]:
        a(_case(m1, (), src, dst, tag="0d"))
    a(_case(m2, (), [P(), R], [R, R], tag="0d"))
    a(_case(m2, (), [R, R], [P(), P()], tag="0d"))
    # invalid shard dim
    a(_case(m1, (3, 4), [S(2)], [R], tag="baddim"))
    a(_case(m1, (3, 4), [R], [S(2)], tag="baddim"))
    # Partial reduce ops from distribute_tensor (Replicate -> Partial partition value)
    for op in ["sum", "avg", "max", "min", "product"]:
        a(_case(m1, (5,), [P(op)], [R], tag="partial-op"))
        a(_case(m1, (6, 5), [P(op)], [S(0)], tag="partial-op"))
    # Partial sources built from_local with rank-dependent values (real partial sums)
    for op in ["sum", "avg", "max", "min"]:
        a(_case(m1, (5, 3), [P(op)], [R], mode="from_local", tag="partial-fl"))
        a(_case(m1, (5, 3), [P(op)], [S(0)], mode="from_local", tag="partial-fl"))
        a(_case(m1, (5, 3), [P(op)], [S(1)], mode="from_local", tag="partial-fl"))
    a(_case(m1, (7,), [P()], [P("avg")], mode="from_local", tag="partial-fl"))
    a(_case(m1, (7,), [P()], [P()], mode="from_local", tag="partial-fl"))
    # src_data_rank
    for sdr in [1, 3, None]:
        for src in ([S(0)], [R], [P()], [S(1)]):
            a(_case(m1, (5, 3), src, [R], src_data_rank=sdr, offset=1000.0, tag="sdr"))
    a(_case(m1, (5, 3), [S(0)], [R], src_data_rank=0, offset=1000.0, tag="sdr"))
    for sdr in [0, 1, None]:
        for src in ([S(0), S(1)], [S(0), S(0)], [R, S(1)], [P(), S(0)]):
            a(_case(m2, (5, 3), src, [R, R], src_data_rank=sdr, offset=1000.0, tag="sdr"))
    a(_case(m2, (4, 4), [S(0), R], [R, R], src_data_rank=3, offset=1000.0, tag="sdr"))
    # from_local run_check (Replicate broadcast from coordinate 0, metadata check)
    a(_case(m1, (5, 3), [R], [R], mode="from_local", run_check=True, delta="rank", tag="run_check"))
    a(_case(m1, (5, 3), [R], [R], mode="from_local", run_check=False, delta="rank", tag="run_check"))
    a(_case(m2, (4, 3), [R, S(0)], [R, R], mode="from_local", run_check=True, delta="rank", tag="run_check"))
    a(_case(m2, (4, 3), [S(0), R], [R, R], mode="from_local", run_check=True, delta="rank", tag="run_check"))
    a(_case(m1, (8, 3), [S(0)], [R], mode="from_local", run_check=True, pass_shape=False, tag="run_check"))
    a(_case(m1, (5, 3), [S(0)], [R], mode="from_local", run_check=True, pass_shape=False, tag="run_check"))
    # (uneven + run_check=False + no shape would make ranks disagree on the global shape and
    # crash Gloo with mismatched collective sizes, so only the even variant is run)
    a(_case(m1, (8, 3), [S(0)], [R], mode="from_local", run_check=False, pass_shape=False, tag="run_check"))
    a(_case(m1, (5, 3), [S(0)], [R], mode="from_local", run_check=True, pass_shape=True, tag="run_check"))
    a(_case(m1, (5, 3), [P()], [R], mode="from_local", run_check=True, pass_shape=False, tag="run_check"))
    # 2-D mesh: both mesh dims shard the same tensor dim, and nested/misaligned sharding
    for shape in [(8, 3), (5, 3), (3, 2), (1, 4), (0, 2)]:
        for src, dst in [([S(0), S(0)], [R, R]), ([R, R], [S(0), S(0)]), ([S(0), S(0)], [R, S(0)]),
                         ([R, S(0)], [S(0), S(0)]), ([S(0), S(0)], [S(0), R]),
                         ([S(0), S(0)], [S(1), S(1)]), ([S(0), S(0)], [S(0), S(1)]),
                         ([S(0), S(1)], [S(1), S(0)]), ([P(), P()], [S(0), S(0)]),
                         ([S(0), S(0)], [P(), P()])]:
            a(_case(m2, shape, src, dst, tag="2d-nested"))
    a(_case(m2, (5, 3), [S(0), R], [R, S(0)], tag="2d"))
    a(_case(m2, (5, 7), [S(1), S(0)], [S(0), S(1)], tag="2d"))
    a(_case(m2, (3, 5, 2), [S(2), S(1)], [S(1), S(1)], tag="2d"))
    a(_case(m2, (5, 3), [P(), S(0)], [S(0), R], tag="2d"))
    a(_case(m2, (5, 3), [S(0), P()], [R, S(0)], tag="2d"))
    a(_case(m2, (5, 3), [P(), P()], [R, R], tag="2d"))
    a(_case(m2, (5, 3), [P("avg"), P()], [R, R], tag="2d"))
    a(_case(m2, (6, 3), [P("avg"), P()], [S(0), S(0)], tag="2d"))
    a(_case(m2, (5, 3), [P("max"), P("max")], [R, S(1)], tag="2d"))
    a(_case(m2, (5, 3), [P("max"), P("sum")], [R, R], tag="2d"))
    a(_case(m2, (5, 3), [R, R], [P(), R], tag="2d"))
    a(_case(m2, (5, 3), [S(0), R], [P(), R], tag="2d"))
    a(_case(m2, (5, 3), [S(0), S(0)], [P(), S(0)], tag="2d"))
    a(_case(m2, (5, 3), [R, S(1)], [S(0), P()], tag="2d"))
    a(_case(m2, (5, 3), [P(), P()], [R, S(0)], mode="from_local", tag="2d-partial-fl"))
    a(_case(m2, (5, 3), [P(), R], [S(1), S(0)], mode="from_local", tag="2d-partial-fl"))
    a(_case(m2, (5, 3), [S(0), P()], [R, R], mode="from_local", tag="2d-partial-fl"))
    a(_case(m2, (5, 3), [S(0), P("avg")], [S(0), S(0)], mode="from_local", tag="2d-partial-fl"))
    a(_case(m2, (6, 3), [P("avg"), P("sum")], [S(0), S(0)], mode="from_local", tag="2d-partial-fl"))
    a(_case(m2, (5, 3), [P("max"), P("max")], [R, S(0)], mode="from_local", tag="2d-partial-fl"))
    # --- FSDP over TP (fully_shard after parallelize_module) on a ("dp", "tp") 2x2 mesh: the placements of
    # every weight of the small Llama (hidden 64, 2 kv heads of 16, ffn 128, vocab 256). Where TP shards dim
    # 0 (embeddings, q/k/v, gate/up, lm_head) FSDP's Shard(0) is _StridedShard(0, sf=tp).
    for shape in [(256, 64), (64, 64), (32, 64), (128, 64), (6, 4), (8, 3)]:
        a(_case(m2, shape, [R, R], [SS(0, 2), S(0)], tag="fsdp_tp"))
        a(_case(m2, shape, [SS(0, 2), S(0)], [R, R], tag="fsdp_tp"))
        a(_case(m2, shape, [SS(0, 2), S(0)], [S(0), R], tag="fsdp_tp"))
    for shape in [(64, 64), (64, 128)]:  # o_proj, down_proj: TP Shard(1)
        a(_case(m2, shape, [R, R], [S(0), S(1)], tag="fsdp_tp"))
        a(_case(m2, shape, [S(0), S(1)], [R, R], tag="fsdp_tp"))
    a(_case(m2, (64,), [R, R], [S(0), R], tag="fsdp_tp"))  # norms: TP Replicate
    # --- _StridedShard beyond FSDP's even case: uneven pieces, shards that are not one box (7 rows,
    # sf=3: rank (0, 0) holds rows {0, 1, 3}), a split factor other than the later mesh dim's size, dim 1,
    # a strided shard with no later shard of its dim, strided to strided. src_data_rank=None (local cuts):
    # PyTorch's scatter needs even pieces (we broadcast, so we take any); then src_data_rank 1, even.
    for shape, src in [((5, 3), [SS(0, 2), S(0)]), ((7, 3), [SS(0, 3), S(0)]), ((9, 2), [SS(0, 2), S(0)]),
                       ((13, 2), [SS(0, 2), S(0)]), ((3, 7), [SS(1, 3), S(1)]), ((6, 5), [SS(0, 2), S(1)]),
                       ((2, 3), [SS(0, 2), S(0)]), ((0, 3), [SS(0, 2), S(0)])]:
        a(_case(m2, shape, [R, R], src, src_data_rank=None, tag="strided"))
        a(_case(m2, shape, src, [R, R], src_data_rank=None, tag="strided"))
        a(_case(m2, shape, src, [S(0), S(0)], src_data_rank=None, tag="strided"))
    # Left out: PyTorch 2.14 is wrong where the split factor is not the later mesh dims' size beyond what
    # pytorch_wrong_value catches (the backward of (R, _S(0, 3)) -> (S(0), S(0)); _S(0, 3) -> _S(0, 2) gives
    # shards that are not its own distribute_tensor's) or crashes (uneven _S(0, 3) -> _S(0, 2): Gloo size
    # mismatch). StridedShard.* in dtensor_tests covers those layouts against a torch.chunk reference.
    a(_case(m2, (8, 3), [SS(0, 2), S(0)], [S(1), SS(0, 2)], tag="strided"))
    a(_case(m2, (8, 3), [SS(0, 2), S(0)], [R, R], src_data_rank=1, offset=1.0, tag="strided"))
    a(_case(m2, (12, 4), [SS(0, 2), S(0)], [S(0), R], src_data_rank=1, offset=1.0, tag="strided"))
    return H


def _random_cases(rng, n1, n2):
    out = []

    def shard_choices(ndim):
        ch = [S(d) for d in range(ndim)]
        if ndim:
            ch.append(S(-1))
        return ch

    def pick_shape():
        nd = rng.choice([1, 1, 2, 2, 2, 3, 3])
        return rng.choice(SHAPES[nd])

    for _ in range(n1):
        shape = pick_shape()
        srcs = shard_choices(len(shape)) + [R, P()]
        dsts = shard_choices(len(shape)) + [R, P(), P("avg")]
        out.append(_case((4,), shape, [rng.choice(srcs)], [rng.choice(dsts)], tag="rand"))
    for _ in range(n2):
        shape = pick_shape()
        srcs = shard_choices(len(shape)) + [R, R, P()]
        dsts = shard_choices(len(shape)) + [R, R, P(), P("avg")]
        src = [rng.choice(srcs), rng.choice(srcs)]
        dst = [rng.choice(dsts), rng.choice(dsts)]
        out.append(_case((2, 2), shape, src, dst, tag="rand"))
    return out


def generate_cases():
    """Deterministic case list (hand-written + seeded random), ids assigned in order."""
    rng = random.Random(1234)
    cases, seen = [], set()
    for c in _hand_cases() + _random_cases(rng, 50, 75):
        key = json.dumps({k: v for k, v in c.items() if k != "tag"}, sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        cases.append(c)
    for i, c in enumerate(cases):
        c["id"] = f"c{i:04d}"
    return cases


# ----------------------------------------------------------------------------
# worker
# ----------------------------------------------------------------------------


def _tj(t):
    t = t.detach().contiguous().float()
    return {"shape": list(t.shape), "values": [float(v) for v in t.reshape(-1).tolist()]}


def _base(shape, offset, rank):
    import torch

    n = 1
    for s in shape:
        n *= s
    t = torch.arange(n, dtype=torch.float32).reshape(shape) * 0.25 - 1.0
    if offset:
        t = t + offset * rank
    return t


def _normalize(placements, ndim):
    from torch.distributed.tensor import Shard

    return [Shard(p.dim + ndim) if isinstance(p, Shard) and p.dim < 0 else p for p in placements]


def _contig_stride(shape):
    st, acc = [], 1
    for s in reversed(shape):
        st.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(st))


def _from_local_input(case, mesh, placements, rank):
    """Local tensor for from_local mode: this rank's torch.chunk piece of base (Shard dims),
    plus a delta: "partial" -> sum over Partial mesh dims d of 10*(d+1)*(coord_d+1);
    "rank" -> 100*global_rank."""
    import torch
    from torch.distributed.tensor import Shard

    shape = case["shape"]
    t = _base(shape, 0.0, rank)
    coord = mesh.get_coordinate()
    for d, p in enumerate(placements):
        if isinstance(p, Shard):
            pieces = list(torch.chunk(t, mesh.size(d), dim=p.dim)) if t.ndim else [t]
            while len(pieces) < mesh.size(d):
                sz = list(t.shape)
                sz[p.dim] = 0
                pieces.append(t.new_zeros(sz))
            t = pieces[coord[d]]
    t = t.contiguous().clone()
    delta = 0.0
    if case["from_local_delta"] == "rank":
        delta = 100.0 * rank
    else:
        for d, p in enumerate(placements):
            if p.is_partial():
                delta += 10.0 * (d + 1) * (coord[d] + 1)
    return t + delta


def setup(rank):
    """The two device meshes, by shape: (4,) and (2, 2) = [[0, 1], [2, 3]]."""
    from torch.distributed.device_mesh import init_device_mesh

    return {(4,): init_device_mesh("cpu", (4,)), (2, 2): init_device_mesh("cpu", (2, 2))}


def run_case(i, case, meshes, rank):
    """One case on this rank (i, the case's index, is not needed: the data depend on the case only)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor
    from torch.distributed.tensor._utils import (
        compute_global_tensor_info,
        compute_local_shape_and_global_offset,
    )

    mesh = meshes[tuple(case["mesh_shape"])]
    shape = tuple(case["shape"])
    ndim = len(shape)
    src_pl = [parse_placement(s) for s in case["src"]]
    dst_pl = [parse_placement(s) for s in case["dst"]]
    res = {}
    out = {"rank": res}

    def meta(pl):
        try:
            ls, off = compute_local_shape_and_global_offset(torch.Size(shape), mesh, _normalize(pl, ndim))
            return {"local_shape": list(ls), "global_offset": list(off)}
        except Exception as e:  # noqa: BLE001
            return {"error": error_text(e)}

    res["src_meta"] = meta(src_pl)
    res["dst_meta"] = meta(dst_pl)

    # ---- build the source DTensor
    try:
        if case["src_mode"] == "distribute":
            inp = _base(shape, case["rank_input_offset"], rank).requires_grad_(True)
            src = distribute_tensor(inp, mesh, src_pl, src_data_rank=case["src_data_rank"])
            leaf = src
        else:
            local = _from_local_input(case, mesh, _normalize(src_pl, ndim), rank).requires_grad_(True)
            kw = {}
            if case["from_local_pass_shape"]:
                kw = {"shape": torch.Size(shape), "stride": _contig_stride(shape)}
            src = DTensor.from_local(local, mesh, src_pl, run_check=case["run_check"], **kw)
            leaf = local
            res["from_local_global_shape"] = list(src.shape)
    except Exception as e:  # noqa: BLE001
        out["error"] = error_text(e)
        out["stage"] = "src"
        return out
    res["src_local"] = _tj(src.to_local())
    res["src_placements"] = [repr(p) for p in src.placements]
    res["src_requires_grad"] = bool(src.requires_grad)
    try:
        res["inferred_global_shape"] = list(
            compute_global_tensor_info(src.to_local(), mesh, list(src.placements))[0])
    except Exception as e:  # noqa: BLE001
        res["inferred_global_shape"] = {"error": error_text(e)}

    # ---- redistribute
    try:
        dst = src.redistribute(mesh, dst_pl)
    except Exception as e:  # noqa: BLE001
        out["error"] = error_text(e)
        out["stage"] = "redistribute"
        return out
    res["dst_local"] = _tj(dst.to_local())
    res["dst_placements"] = [repr(p) for p in dst.placements]
    res["dst_global_shape"] = list(dst.shape)

    # ---- full tensor (collective; recorded for rank 0 only)
    try:
        with torch.no_grad():
            full = dst.full_tensor()
        plain_value = case["src_mode"] == "distribute" and not case["rank_input_offset"] and not any(
            x.startswith("Partial") for x in case["src"] + case["dst"])
        if rank == 0:
            out["full"] = _tj(full)
            # PyTorch 2.14 gathers some _StridedShard layouts (a split factor other than the later mesh dims'
            # size) to a wrong value: flag it, so the replay checks the value instead of PyTorch's shards.
            if plain_value and not torch.equal(full, _base(case["shape"], 0.0, 0)):
                out["pytorch_wrong_value"] = True
        if "_StridedShard" in repr(case["src"]):  # the backward passes through the source's layout too
            with torch.no_grad():
                src_full = src.full_tensor()
            if rank == 0 and plain_value and not torch.equal(src_full, _base(case["shape"], 0.0, 0)):
                out["pytorch_wrong_value"] = True
    except Exception as e:  # noqa: BLE001
        out["full_error"] = error_text(e)

    # ---- backward: dst.to_local().backward(grad_out)
    try:
        loc = dst.to_local()
        n = loc.numel()
        g = (torch.arange(n, dtype=torch.float32) * 0.125 + (rank + 1)).reshape(loc.shape)
        res["grad_out"] = _tj(g)
        loc.backward(g)
        gr = leaf.grad
        if gr is None:
            res["src_grad"] = None
        elif isinstance(gr, DTensor):
            d = _tj(gr.to_local())
            d["placements"] = [repr(p) for p in gr.placements]
            res["src_grad"] = d
        else:
            res["src_grad"] = _tj(gr)
    except Exception as e:  # noqa: BLE001
        res["backward_error"] = error_text(e)
    return out


# ----------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------


def _merge(cases, per_rank):
    merged = []
    for i, case in enumerate(cases):
        c = dict(case)
        r0 = per_rank[0][i]
        for k in ("error", "stage", "full", "full_error", "inconsistent_error", "trace", "pytorch_wrong_value"):
            if k in r0:
                c[k] = r0[k]
        c["ranks"] = [per_rank[r][i]["rank"] if "rank" in per_rank[r][i] else {}
                      for r in range(WORLD_SIZE)]
        merged.append(c)
    return merged


def main():
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[3], file=sys.stderr)
        sys.exit(2)
    out_path = sys.argv[1]
    t0 = time.time()
    cases = generate_cases()
    per_rank, torch_version, timing = run_on_ranks(WORLD_SIZE, setup, run_case, cases)
    doc = {
        "torch_version": torch_version,
        "world_size": WORLD_SIZE,
        "conventions": {
            "input": "arange(numel, float32).reshape(shape) * 0.25 - 1.0 + rank_input_offset * global_rank",
            "from_local_input": "torch.chunk piece of input (offset 0) per Shard placement and mesh coordinate, "
                                "+ delta: 'partial' -> sum_{d: Partial} 10*(d+1)*(coord_d+1); 'rank' -> 100*rank",
            "grad_out": "arange(local numel)*0.125 + (rank+1), reshaped to dst local shape",
            "meshes": "(4,) = init_device_mesh('cpu',(4,)); (2,2) = [[0,1],[2,3]]",
        },
        "cases": _merge(cases, per_rank),
    }
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    n_err = sum(1 for c in doc["cases"] if "error" in c)
    n_incons = sum(1 for c in doc["cases"] if "inconsistent_error" in c)
    print(f"cases={len(doc['cases'])} errors={n_err} inconsistent={n_incons} "
          f"time={time.time() - t0:.1f}s ({timing}) size={os.path.getsize(out_path)}B -> {out_path}")


if __name__ == "__main__":
    main()
