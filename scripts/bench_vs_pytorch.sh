#!/usr/bin/env bash
# Our benchmark and PyTorch's Python DTensor doing the same, on the same machine and world size:
#   ./scripts/bench_vs_pytorch.sh dispatch       per-op dispatch overhead (tools/bench/dispatch_bench.*)
#   ./scripts/bench_vs_pytorch.sh redistribute   redistribute overhead over the raw collective
#   ./scripts/bench_vs_pytorch.sh tp_step        a Colwise/Rowwise MLP training step's overhead
# Ours runs twice, on the same-host shared-memory backend and on Gloo (DTENSOR_BACKEND=shm / gloo);
# PyTorch's Python TP on CPU has only Gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:?usage: bench_vs_pytorch.sh dispatch|redistribute|tp_step [args]}
shift
case "$bench" in dispatch|redistribute|tp_step) ;; *) echo "unknown benchmark '$bench'" >&2; exit 2 ;; esac
./scripts/setup.sh >/dev/null
NPROC=${NPROC:-2}
for backend in shm gloo; do
  echo "## dtensor-cpp, process groups on DTENSOR_BACKEND=$backend"
  DTENSOR_BACKEND=$backend build/bin/tprun --nproc-per-node "$NPROC" --master-port 0 --no-prefix "${bench}_bench" "$@" 2>/dev/null
  echo
done
echo "## PyTorch (Gloo)"
OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node "$NPROC" "tools/bench/${bench}_bench.py" "$@" 2>/dev/null
