#!/usr/bin/env python3
"""Oracle: run PyTorch's own tensor-parallel styles (torch.distributed.tensor.parallel) on small
modules (world size 2, CPU, Gloo) and dump everything a C++ test needs to replay them as JSON.

Usage:  python tests/oracle/tp_styles_oracle.py OUT.json

Top-level JSON: {"torch_version": str, "world_size": 2, "cases": [case, ...]}

Tensor JSON:    {"shape": [...], "dtype": "float32" | "int64", "values": [flat row-major list]}
Placement str:  PyTorch repr: "Shard(dim=1)", "Replicate()", "Partial(sum)". In plan fields dims are
                written as given (e.g. "Shard(dim=-1)"); placements observed on tensors are
                repr(p) of what PyTorch reports.

Each case:
  id            str
  model         "linear" | "linear_nobias" | "mlp" | "embedding" | "layernorm" | "rmsnorm" |
                "block" | "kwmodel"   (module definitions: see MODULES below)
  plan          [[path, style_json], ...] in the order applied. A plan that is the single entry
                ["", style] is applied as parallelize_module(model, mesh, style); otherwise all entries
                go into one dict (in this order): parallelize_module(model, mesh, {path: style, ...}).
                Path "" = the root module; paths may contain fnmatch globs ("in_*").
  style_json    {"style": name, <every constructor keyword with its effective value>}
                  ColwiseParallel / RowwiseParallel: input_layouts, output_layouts, use_local_output
                  SequenceParallel: sequence_dim, use_local_output
                  PrepareModuleInput: input_layouts (list, entries may be null; or null),
                      desired_input_layouts (same), input_kwarg_layouts (object),
                      desired_input_kwarg_layouts (object), use_local_output
                  PrepareModuleOutput: output_layouts, desired_output_layouts (single placements),
                      use_local_output
                  PrepareModuleInputOutput: input_layouts, desired_input_layouts,
                      input_kwarg_layouts, desired_input_kwarg_layouts, use_local_input,
                      output_layouts, desired_output_layouts, use_local_output
                Note: PyTorch's PrepareModuleInput only installs its kwargs hook when
                input_kwarg_layouts was passed (not None); "{}" here means it was not passed.
  arg_layouts   [placement str or null, ...]: layout each positional input arrives in (null = None arg)
  kwarg_layouts {name: placement str}: same for keyword inputs
  out_layout    expected layout of the model output as a plan-style placement str; for a plain-tensor
                output this is how grad_output was cut (a DTensor output is cut by its own placements)
  params        {name: tensor}: model.named_parameters() full values BEFORE parallelize_module
  param_placements {name: [placement strs]}: after parallelize_module (absent if not a DTensor)
  param_grads   {name: tensor + "placements": [strs]}: p.grad.full_tensor() and p.grad.placements
                (plain-tensor grad: rank 0's tensor, "placements": null; no grad: null)
  ranks         [per-rank dict, index = rank]:
      args         [tensor or null, ...]  this rank's positional inputs (plain local tensors)
      kwargs       {"scale": tensor} or {}
      output       the output's local tensor (out.to_local() if out is a DTensor)
      output_placements [strs] or null (null = the model returned a plain tensor)
      grad_output  local gradient fed as local_out.backward(grad_output)
      comm_forward, comm_backward  {collective: count} PyTorch's CommDebugMode saw during the forward /
                   the backward, names shortened to all_reduce, all_gather, reduce_scatter, all_to_all,
                   broadcast, scatter
      arg_grads    [tensor or null, ...] .grad of each float positional input (leaf,
                   requires_grad=True); null for int inputs / None args / no grad
      kwarg_grads  {name: tensor or null}: same for keyword inputs
      param_grad_local_shapes {name: shape or null}: shape of this rank's p.grad local tensor (the
                   grad's placements can differ from the param's: e.g. a Rowwise Embedding's Shard(0)
                   weight gets a Replicate() grad holding the whole [vocab, dim] gradient)
  error         present iff PyTorch raised: "<Type>: <message>" (then params etc. may be missing)

Data (all deterministic, identical on both ranks):
  * model init: torch.manual_seed(1234 + i) (i = 0-based case index), construct the model, then under
    no_grad every LayerNorm/RMSNorm gets weight = 1 + 0.1*randn, LayerNorm bias = 0.1*randn
    (module order, weight then bias); params recorded after that.
  * g = torch.Generator().manual_seed(4321 + i). Global inputs drawn from g in order: positional args
    (skipping None), then kwargs in name order; float = randn, embedding ids = randint(0, 16).
    Local input = whole tensor for Replicate(), torch.chunk(global, 2, dim=d)[rank] for Shard(d).
    Float inputs are leaf tensors with requires_grad_(True).
  * after forward: global grad = randn(full output shape, generator=g); grad_output = this rank's
    piece of it (by the output DTensor's placements, or by out_layout for a plain output).

The processes are spawned and joined by oracle_launch.run_on_ranks (shared with dtensor_oracle.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_launch import error_text, run_on_ranks  # noqa: E402

WORLD_SIZE = 2

R = "Replicate()"


def S(d):
    return f"Shard(dim={d})"


# ----------------------------------------------------------------------------
# styles: JSON dict with every keyword filled in  <->  PyTorch style object
# ----------------------------------------------------------------------------


def colwise(input_layouts=R, output_layouts=S(-1), use_local_output=True):
    return {"style": "ColwiseParallel", "input_layouts": input_layouts,
            "output_layouts": output_layouts, "use_local_output": use_local_output}


def rowwise(input_layouts=S(-1), output_layouts=R, use_local_output=True):
    return {"style": "RowwiseParallel", "input_layouts": input_layouts,
            "output_layouts": output_layouts, "use_local_output": use_local_output}


def sequence_parallel(sequence_dim=1, use_local_output=False):
    return {"style": "SequenceParallel", "sequence_dim": sequence_dim,
            "use_local_output": use_local_output}


def prepare_input(input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                  desired_input_kwarg_layouts=None, use_local_output=False):
    return {"style": "PrepareModuleInput", "input_layouts": input_layouts,
            "desired_input_layouts": desired_input_layouts,
            "input_kwarg_layouts": dict(input_kwarg_layouts or {}),
            "desired_input_kwarg_layouts": dict(desired_input_kwarg_layouts or {}),
            "use_local_output": use_local_output}


def prepare_output(output_layouts, desired_output_layouts, use_local_output=True):
    return {"style": "PrepareModuleOutput", "output_layouts": output_layouts,
            "desired_output_layouts": desired_output_layouts, "use_local_output": use_local_output}


def prepare_input_output(output_layouts, desired_output_layouts, input_layouts=None,
                         desired_input_layouts=None, input_kwarg_layouts=None,
                         desired_input_kwarg_layouts=None, use_local_input=False,
                         use_local_output=True):
    return {"style": "PrepareModuleInputOutput", "input_layouts": input_layouts,
            "desired_input_layouts": desired_input_layouts,
            "input_kwarg_layouts": dict(input_kwarg_layouts or {}),
            "desired_input_kwarg_layouts": dict(desired_input_kwarg_layouts or {}),
            "use_local_input": use_local_input, "output_layouts": output_layouts,
            "desired_output_layouts": desired_output_layouts, "use_local_output": use_local_output}


def parse_placement(s):
    from torch.distributed.tensor import Partial, Replicate, Shard

    if s is None:
        return None
    if s == "Replicate()":
        return Replicate()
    if s.startswith("Shard(dim=") and s.endswith(")"):
        return Shard(int(s[len("Shard(dim="):-1]))
    if s.startswith("Partial(") and s.endswith(")"):
        return Partial(s[len("Partial("):-1])
    raise ValueError(f"bad placement string {s!r}")


def build_style(sj):
    """PyTorch ParallelStyle object from a style_json dict (every keyword passed explicitly)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleInputOutput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    pp = parse_placement

    def tup(v):  # list of placement strs (null allowed) -> tuple; null -> None
        return None if v is None else tuple(pp(x) for x in v)

    def kw(d):  # {} means "not passed" (PyTorch then does not install its kwargs hook)
        return {k: pp(v) for k, v in d.items()} if d else None

    name = sj["style"]
    if name == "ColwiseParallel":
        return ColwiseParallel(input_layouts=pp(sj["input_layouts"]),
                               output_layouts=pp(sj["output_layouts"]),
                               use_local_output=sj["use_local_output"])
    if name == "RowwiseParallel":
        return RowwiseParallel(input_layouts=pp(sj["input_layouts"]),
                               output_layouts=pp(sj["output_layouts"]),
                               use_local_output=sj["use_local_output"])
    if name == "SequenceParallel":
        return SequenceParallel(sequence_dim=sj["sequence_dim"],
                                use_local_output=sj["use_local_output"])
    if name == "PrepareModuleInput":
        return PrepareModuleInput(input_layouts=tup(sj["input_layouts"]),
                                  desired_input_layouts=tup(sj["desired_input_layouts"]),
                                  input_kwarg_layouts=kw(sj["input_kwarg_layouts"]),
                                  desired_input_kwarg_layouts=kw(sj["desired_input_kwarg_layouts"]),
                                  use_local_output=sj["use_local_output"])
    if name == "PrepareModuleOutput":
        return PrepareModuleOutput(output_layouts=pp(sj["output_layouts"]),
                                   desired_output_layouts=pp(sj["desired_output_layouts"]),
                                   use_local_output=sj["use_local_output"])
    if name == "PrepareModuleInputOutput":
        return PrepareModuleInputOutput(
            input_layouts=tup(sj["input_layouts"]),
            desired_input_layouts=tup(sj["desired_input_layouts"]),
            input_kwarg_layouts=kw(sj["input_kwarg_layouts"]),
            desired_input_kwarg_layouts=kw(sj["desired_input_kwarg_layouts"]),
            use_local_input=sj["use_local_input"],
            output_layouts=pp(sj["output_layouts"]),
            desired_output_layouts=pp(sj["desired_output_layouts"]),
            use_local_output=sj["use_local_output"])
    raise ValueError(f"unknown style {name!r}")


# ----------------------------------------------------------------------------
# modules (the C++ test builds identical ones)
# ----------------------------------------------------------------------------

X = {"shape": [2, 4, 8], "dtype": "float32"}        # float activation input
IDS = {"shape": [2, 4], "dtype": "int64"}           # embedding ids, randint(0, VOCAB)
VOCAB = 16


def make_model(kind):
    import torch.nn as nn
    import torch.nn.functional as F

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.in_proj = nn.Linear(8, 16)
            self.relu = nn.ReLU()
            self.out_proj = nn.Linear(16, 8)

        def forward(self, x):
            return self.out_proj(self.relu(self.in_proj(x)))

    class FFN(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(8, 16, bias=False)
            self.w3 = nn.Linear(8, 16, bias=False)
            self.w2 = nn.Linear(16, 8, bias=False)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.ffn = FFN()

        def forward(self, x):
            return x + self.ffn(self.norm(x))

    class KwModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x, bias=None, scale=None):
            y = self.lin(x)
            if bias is not None:
                y = y + bias
            if scale is not None:
                y = y * scale
            return y

    ctors = {
        "linear": lambda: nn.Linear(8, 12),
        "linear_nobias": lambda: nn.Linear(8, 12, bias=False),
        "mlp": MLP,
        "embedding": lambda: nn.Embedding(VOCAB, 8),
        "layernorm": lambda: nn.LayerNorm(8),
        "rmsnorm": lambda: nn.RMSNorm(8, eps=1e-6),
        "block": Block,
        "kwmodel": KwModel,
    }
    return ctors[kind]()


# ----------------------------------------------------------------------------
# case table
# ----------------------------------------------------------------------------


def _arg(spec, layout):
    return dict(spec, layout=layout)


def _c(cid, model, plan, args, out_layout, kwargs=None):
    return {"id": cid, "model": model, "plan": [[p, s] for p, s in plan], "args": args,
            "kwargs": kwargs or {}, "out_layout": out_layout}


def generate_cases():
    xr, xs1, xsl = _arg(X, R), _arg(X, S(1)), _arg(X, S(-1))
    ids = _arg(IDS, R)
    block_common = [
        ("norm", sequence_parallel()),
    ]
    return [
        _c("linear_colwise", "linear", [("", colwise())], [xr], S(-1)),
        _c("linear_colwise_rep", "linear", [("", colwise(output_layouts=R))], [xr], R),
        _c("linear_colwise_dtensor_out", "linear", [("", colwise(use_local_output=False))], [xr], S(-1)),
        _c("linear_rowwise", "linear", [("", rowwise())], [xsl], R),
        _c("linear_rowwise_seq", "linear", [("", rowwise(output_layouts=S(1)))], [xsl], S(1)),
        _c("linear_colwise_seq_in", "linear_nobias", [("", colwise(input_layouts=S(1)))], [xs1], S(-1)),
        _c("linear_rowwise_rep_in", "linear", [("", rowwise(input_layouts=R))], [xr], R),
        _c("mlp_colwise_rowwise", "mlp", [("in_proj", colwise()), ("out_proj", rowwise())], [xr], R),
        _c("mlp_sequence_parallel", "mlp",
           [("in_proj", colwise(input_layouts=S(1))), ("out_proj", rowwise(output_layouts=S(1)))],
           [xs1], S(1)),
        _c("mlp_glob", "mlp", [("in_*", colwise()), ("out_*", rowwise(use_local_output=False))],
           [xr], R),
        _c("embedding_rowwise", "embedding", [("", rowwise(input_layouts=R))], [ids], R),
        _c("embedding_rowwise_seq", "embedding", [("", rowwise(input_layouts=R, output_layouts=S(1)))],
           [ids], S(1)),
        _c("embedding_colwise", "embedding", [("", colwise())], [ids], S(-1)),
        _c("layernorm_sp", "layernorm", [("", sequence_parallel())], [xs1], S(1)),
        _c("rmsnorm_sp", "rmsnorm", [("", sequence_parallel())], [xs1], S(1)),
        _c("layernorm_sp_from_replicate", "layernorm", [("", sequence_parallel(use_local_output=True))],
           [xs1], S(1)),
        _c("block_sp", "block", block_common + [
            ("ffn", prepare_input(input_layouts=[S(1)], desired_input_layouts=[R])),
            ("ffn.w1", colwise()),
            ("ffn.w3", colwise()),
            ("ffn.w2", rowwise(output_layouts=S(1))),
        ], [xs1], S(1)),
        _c("block_io", "block", block_common + [
            ("ffn", prepare_input_output(input_layouts=[S(1)], desired_input_layouts=[R],
                                         use_local_input=False, output_layouts=R,
                                         desired_output_layouts=S(1), use_local_output=True)),
            ("ffn.w1", colwise()),
            ("ffn.w3", colwise()),
            ("ffn.w2", rowwise(use_local_output=False)),
        ], [xs1], S(1)),
        _c("kwmodel_kwargs", "kwmodel", [
            ("", prepare_input(input_layouts=[R, None], desired_input_layouts=[R, None],
                               input_kwarg_layouts={"scale": S(0)},
                               desired_input_kwarg_layouts={"scale": R}, use_local_output=True)),
            ("lin", colwise(output_layouts=R)),
        ], [xr, None], R, kwargs={"scale": _arg(X, S(0))}),
        _c("kwmodel_none_positional", "kwmodel", [
            ("", prepare_input(input_layouts=[R, R], desired_input_layouts=[R, R],
                               use_local_output=True)),
            ("lin", colwise(output_layouts=R)),
        ], [xr, _arg({"shape": [8], "dtype": "float32"}, R)], R),
    ]


# ----------------------------------------------------------------------------
# worker
# ----------------------------------------------------------------------------


def _tj(t):
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.int64:
        return {"shape": list(t.shape), "dtype": "int64",
                "values": [int(v) for v in t.reshape(-1).tolist()]}
    t = t.float()
    return {"shape": list(t.shape), "dtype": "float32",
            "values": [float(v) for v in t.reshape(-1).tolist()]}


def _local_piece(t, layout, rank):
    """This rank's piece of a global tensor for a single placement string."""
    import torch

    if layout == R:
        return t.clone()
    if layout.startswith("Shard(dim="):
        d = int(layout[len("Shard(dim="):-1])
        return torch.chunk(t, WORLD_SIZE, dim=d)[rank].contiguous().clone()
    raise ValueError(f"cannot cut a local piece for layout {layout}")


def _global_input(spec, g):
    import torch

    if spec["dtype"] == "int64":
        return torch.randint(0, VOCAB, spec["shape"], generator=g, dtype=torch.int64)
    return torch.randn(spec["shape"], generator=g)


def _apply_plan(model, mesh, plan):
    from torch.distributed.tensor.parallel import parallelize_module

    if len(plan) == 1 and plan[0][0] == "":
        return parallelize_module(model, mesh, build_style(plan[0][1]))
    return parallelize_module(model, mesh, {p: build_style(s) for p, s in plan})


def _comm_counts(comm):
    """CommDebugMode's counts by collective, with our short names (all_reduce, all_gather, ...)."""
    out = {}
    for op, n in comm.get_comm_counts().items():
        name = str(op)
        for short in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "scatter"):
            if short in name:
                out[short] = out.get(short, 0) + n
                break
        else:
            out[name] = out.get(name, 0) + n
    return out


def setup(rank):
    """The 1-D device mesh over all ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD_SIZE,))


def run_case(i, case, mesh, rank):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    res = {}
    out = {"rank": res}

    # ---- model init + params before parallelize
    torch.manual_seed(1234 + i)
    model = make_model(case["model"])
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.LayerNorm, nn.RMSNorm)):
                if m.weight is not None:
                    m.weight.copy_(1.0 + 0.1 * torch.randn(m.weight.shape))
                if getattr(m, "bias", None) is not None:
                    m.bias.copy_(0.1 * torch.randn(m.bias.shape))
    out["params"] = {n: _tj(p) for n, p in model.named_parameters()}

    # ---- inputs
    g = torch.Generator().manual_seed(4321 + i)
    args, res["args"] = [], []
    for spec in case["args"]:
        if spec is None:
            args.append(None)
            res["args"].append(None)
            continue
        loc = _local_piece(_global_input(spec, g), spec["layout"], rank)
        if loc.is_floating_point():
            loc.requires_grad_(True)
        args.append(loc)
        res["args"].append(_tj(loc))
    kwargs, res["kwargs"] = {}, {}
    for k in sorted(case["kwargs"]):
        spec = case["kwargs"][k]
        loc = _local_piece(_global_input(spec, g), spec["layout"], rank)
        if loc.is_floating_point():
            loc.requires_grad_(True)
        kwargs[k] = loc
        res["kwargs"][k] = _tj(loc)

    try:
        model = _apply_plan(model, mesh, case["plan"])
        out["param_placements"] = {n: [repr(p) for p in prm.placements]
                                   for n, prm in model.named_parameters() if isinstance(prm, DTensor)}

        # ---- forward
        with CommDebugMode() as comm:
            y = model(*args, **kwargs)
        res["comm_forward"] = _comm_counts(comm)
        if isinstance(y, DTensor):
            y_local = y.to_local()
            res["output_placements"] = [repr(p) for p in y.placements]
            full_shape = list(y.shape)
        else:
            y_local = y
            res["output_placements"] = None
            lay = case["out_layout"]
            full_shape = list(y.shape)
            if lay.startswith("Shard(dim="):
                d = int(lay[len("Shard(dim="):-1]) % y.ndim
                sizes = [None] * WORLD_SIZE
                dist.all_gather_object(sizes, int(y.shape[d]))
                full_shape[d] = sum(sizes)
            elif lay != R:
                raise ValueError(f"case declares out_layout {lay} for a plain-tensor output")
        res["output"] = _tj(y_local)

        # ---- backward
        grad_full = torch.randn(full_shape, generator=g)
        if isinstance(y, DTensor):
            if len(y.placements) != 1 or y.placements[0].is_partial():
                raise ValueError(f"unexpected output placements {y.placements}")
            grad_local = _local_piece(grad_full, repr(y.placements[0]), rank)
        else:
            grad_local = _local_piece(grad_full, case["out_layout"], rank)
        if list(grad_local.shape) != list(y_local.shape):
            raise ValueError(f"grad piece {list(grad_local.shape)} != output {list(y_local.shape)}")
        res["grad_output"] = _tj(grad_local)
        with CommDebugMode() as comm:
            y_local.backward(grad_local)
        res["comm_backward"] = _comm_counts(comm)

        res["arg_grads"] = [None if (a is None or a.grad is None) else _tj(a.grad) for a in args]
        res["kwarg_grads"] = {k: None if v.grad is None else _tj(v.grad) for k, v in kwargs.items()}

        grads = {}
        res["param_grad_local_shapes"] = {}
        for n, prm in model.named_parameters():  # same order on every rank: collectives match
            gr = prm.grad
            if gr is None:
                grads[n] = None
                res["param_grad_local_shapes"][n] = None
            elif isinstance(gr, DTensor):
                res["param_grad_local_shapes"][n] = list(gr.to_local().shape)
                d = _tj(gr.full_tensor())
                d["placements"] = [repr(p) for p in gr.placements]
                grads[n] = d
            else:
                res["param_grad_local_shapes"][n] = list(gr.shape)
                d = _tj(gr)
                d["placements"] = None
                grads[n] = d
        out["param_grads"] = grads
    except Exception as e:  # noqa: BLE001
        out["error"] = error_text(e)
        out["trace"] = traceback.format_exc()[-1500:]
    return out


# ----------------------------------------------------------------------------
# driver
# ----------------------------------------------------------------------------


def _merge(cases, per_rank):
    merged = []
    for i, case in enumerate(cases):
        r0 = per_rank[0][i]
        c = {
            "id": case["id"],
            "model": case["model"],
            "plan": case["plan"],
            "arg_layouts": [None if a is None else a["layout"] for a in case["args"]],
            "kwarg_layouts": {k: v["layout"] for k, v in sorted(case["kwargs"].items())},
            "out_layout": case["out_layout"],
        }
        errs = [per_rank[r][i].get("error") for r in range(WORLD_SIZE)]
        err = next((e for e in errs if e), None)
        if err:
            c["error"] = err
            c["trace"] = next(per_rank[r][i].get("trace") for r in range(WORLD_SIZE) if errs[r])
        for k in ("inconsistent_error",):
            if k in r0:
                c[k] = r0[k]
        for k in ("params", "param_placements", "param_grads"):
            if k in r0:
                c[k] = r0[k]
        c["ranks"] = [per_rank[r][i].get("rank", {}) for r in range(WORLD_SIZE)]
        merged.append(c)
    return merged


def main():
    if len(sys.argv) != 2:
        print("usage: python tests/oracle/tp_styles_oracle.py OUT.json", file=sys.stderr)
        sys.exit(2)
    out_path = sys.argv[1]
    t0 = time.time()
    cases = generate_cases()
    per_rank, torch_version, timing = run_on_ranks(WORLD_SIZE, setup, run_case, cases)
    doc = {"torch_version": torch_version, "world_size": WORLD_SIZE, "cases": _merge(cases, per_rank)}
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    errs = [c["id"] for c in doc["cases"] if "error" in c]
    print(f"cases={len(doc['cases'])} errors={len(errs)}{' ' + str(errs) if errs else ''} "
          f"time={time.time() - t0:.1f}s ({timing}) size={os.path.getsize(out_path)}B -> {out_path}")


if __name__ == "__main__":
    main()
