#!/usr/bin/env bash
# Redistribute overhead, ours and PyTorch's Python DTensor, on the same machine and world size.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
NPROC=${NPROC:-2}
build/bin/tprun --nproc-per-node "$NPROC" --master-port 0 --no-prefix redistribute_bench "$@" 2>/dev/null
echo
OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node "$NPROC" tools/bench/redistribute_bench.py "$@" 2>/dev/null
