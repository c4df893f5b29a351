#!/usr/bin/env bash
# Per-op dispatch overhead, ours and PyTorch's Python DTensor, on the same machine and world size.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
NPROC=${NPROC:-2}
build/bin/tprun --nproc-per-node "$NPROC" --master-port 0 --no-prefix dispatch_bench "$@" 2>/dev/null
echo
OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node "$NPROC" tools/bench/dispatch_bench.py 2>/dev/null
