#!/usr/bin/env bash
# The main job with built-in defaults: a Llama-3-style model trained under torchtitan's tensor + sequence
# parallel plan across 2 processes (tprun --nproc-per-node 2 llama_train), checkpointed to runs/llama.
# Options go to llama_train (./scripts/run.sh --help).
#   ./scripts/run.sh generate [llama_generate options]   trains nothing: the trained model speaks (TP 2, from
#                                                         the newest checkpoint in runs/llama)
# The collective benchmark: build/bin/tprun --nproc-per-node 2 comm_bench.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [[ "${1:-}" == "generate" ]]; then
  shift
  if [[ ! -f runs/llama/config.json ]]; then
    echo "run.sh generate: no trained model in runs/llama yet: run ./scripts/run.sh first" >&2
    exit 2
  fi
  exec build/bin/tprun --nproc-per-node 2 llama_generate --checkpoint runs/llama \
    --prompt "Everyone is permitted to copy" --max-new-tokens 120 --temperature 0.8 --top-k 20 --seed 1 "$@"
fi
exec build/bin/tprun --nproc-per-node 2 llama_train --checkpoint-dir runs/llama --checkpoint-every 100 "$@"
