"""The seeds' pytorch_tp.py run by PyTorch itself (CPU, Gloo) next to our C++ toy_tp and stock_toy_tp: the
losses must agree.

    python tests/oracle/toy_tp_oracle.py <build/bin>

Runs `torchrun --standalone --nproc-per-node 2` on the Python ToyModel with PyTorch's own parallelize_module
(plan {in_proj: Colwise, out_proj: Rowwise}, AdamW lr 0.05, 10 steps, manual_seed(45)), then
`tprun --nproc-per-node 2` of toy_tp (dtensor::nn layers), stock_toy_tp (plain torch::nn::Linear, the same plan)
and stock_toy_tp --pairwise (PairwiseParallel with tp_mesh_dim 1), and compares every step's loss (relative 1e-5).
"""
import os
import re
import subprocess
import sys
import tempfile

PYTORCH_TP = r'''
import os, torch, torch.nn as nn
from peer_exit import end_process_group
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel, RowwiseParallel

class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_proj = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.out_proj = nn.Linear(32, 5)
    def forward(self, x):
        return self.out_proj(self.relu(self.in_proj(x)))

torch.manual_seed(45)
world = int(os.environ["WORLD_SIZE"])
mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp", "tp"))
model = parallelize_module(ToyModel(), mesh["tp"], {"in_proj": ColwiseParallel(), "out_proj": RowwiseParallel()})
opt = torch.optim.AdamW(model.parameters(), lr=0.05, foreach=False)
inp = torch.randn(20, 10)
target = torch.randn(20, 5)
for i in range(10):
    opt.zero_grad()
    loss = (model(inp) - target).var()
    if mesh.get_rank() == 0:
        print(f"loss {i} {loss.item():.7f}", flush=True)
    loss.backward()
    opt.step()
end_process_group(0)  # tests/oracle/peer_exit.py: every rank leaves together, after a barrier
'''


def losses(text):
    return [float(v) for _, v in re.findall(r"loss (\d+) ([-0-9.e]+)", text)]


def main():
    bin_dir = sys.argv[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(PYTORCH_TP)
        script = f.name
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    with tempfile.TemporaryDirectory() as tmp:  # torchrun's torchelastic_* folders go with it
        ref = subprocess.run([torchrun, "--standalone", "--nproc-per-node", "2", script], env=dict(env, TMPDIR=tmp),
                             capture_output=True, text=True, timeout=300)
    os.unlink(script)
    if ref.returncode != 0:
        sys.exit(f"PyTorch run failed:\n{ref.stdout}\n{ref.stderr}")
    a = losses(ref.stdout)
    if len(a) != 10:
        sys.exit(f"expected 10 PyTorch losses, got {len(a)}")
    # Ours: the ToyModel of dtensor::nn layers (toy_tp), and of plain torch::nn::Linear layers under the same plan
    # and under PairwiseParallel with tp_mesh_dim (stock_toy_tp).
    for program in (["toy_tp"], ["stock_toy_tp"], ["stock_toy_tp", "--pairwise"]):
        ours = subprocess.run([os.path.join(bin_dir, "tprun"), "--nproc-per-node", "2", "--master-port", "0", *program],
                              env=env, capture_output=True, text=True, timeout=300)
        if ours.returncode != 0:
            sys.exit(f"{' '.join(program)} failed:\n{ours.stdout}\n{ours.stderr}")
        b = losses(ours.stdout)
        print(f"step  PyTorch TP   {' '.join(program)}")
        for i, (x, y) in enumerate(zip(a, b)):
            print(f"{i:4d}  {x:.7f}   {y:.7f}")
        if len(b) != 10:
            sys.exit(f"expected 10 losses from {' '.join(program)}, got {len(b)}")
        bad = [i for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > 1e-5 * abs(x)]
        if bad:
            sys.exit(f"{' '.join(program)}: losses differ at steps {bad}")
    print("toy TP losses match PyTorch's parallelize_module")


if __name__ == "__main__":
    main()
