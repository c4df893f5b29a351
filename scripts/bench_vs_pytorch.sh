#!/usr/bin/env bash
# Our benchmark and PyTorch's Python DTensor doing the same, on the same machine and world size:
#   ./scripts/bench_vs_pytorch.sh dispatch       per-op dispatch overhead (tools/bench/dispatch_bench.*)
#   ./scripts/bench_vs_pytorch.sh redistribute   redistribute overhead over the raw collective
#   ./scripts/bench_vs_pytorch.sh tp_step        a Colwise/Rowwise MLP training step's overhead
#   ./scripts/bench_vs_pytorch.sh llama_step     a Llama training step (dim 512, 4 layers, seq 256, batch 8, SP):
#                                                TP=2 on 1 thread per rank vs TP=1 on 2 threads (the same 2 cores)
#   ./scripts/bench_vs_pytorch.sh mixed_precision  llama_train --mixed-precision bf16 / off beside PyTorch's autocast
#                                                and fp32 at TP 1 and 2, with this machine's matmul peaks measured
#                                                in the same run (tools/bench/mixed_precision_bench.py)
# Ours runs twice, on the same-host shared-memory backend and on Gloo (DTENSOR_BACKEND=shm / gloo);
# PyTorch's Python TP on CPU has only Gloo.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=${1:?usage: bench_vs_pytorch.sh dispatch|redistribute|tp_step|llama_step|mixed_precision [args]}
shift
case "$bench" in dispatch|redistribute|tp_step|llama_step|mixed_precision) ;; *) echo "unknown benchmark '$bench'" >&2; exit 2 ;; esac
./scripts/setup.sh >/dev/null
if [ "$bench" = mixed_precision ]; then
  exec .venv/bin/python tools/bench/mixed_precision_bench.py build/bin "$@"
fi
if [ "$bench" = llama_step ]; then
  # Both sides run their own configurations (TP=1 on 2 threads, TP=2 on 1 thread per rank) and print ratios.
  echo "## dtensor-cpp (llama_train; TP=2 on shared memory and on Gloo)"
  build/bin/llama_step_bench "$@"
  echo
  echo "## PyTorch (parallelize_module, Gloo)"
  .venv/bin/python tools/bench/llama_step_bench.py "$@"
  exit 0
fi
NPROC=${NPROC:-2}
for backend in shm gloo; do
  echo "## dtensor-cpp, process groups on DTENSOR_BACKEND=$backend"
  DTENSOR_BACKEND=$backend build/bin/tprun --nproc-per-node "$NPROC" --master-port 0 --no-prefix "${bench}_bench" "$@" 2>/dev/null
  echo
done
echo "## PyTorch (Gloo)"
OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc-per-node "$NPROC" "tools/bench/${bench}_bench.py" "$@" 2>/dev/null
