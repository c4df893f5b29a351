#!/usr/bin/env bash
# The main job with built-in defaults: a Llama-3-style model trained under torchtitan's tensor + sequence
# parallel plan across 2 processes (tprun --nproc-per-node 2 llama_train). Options go to llama_train
# (./scripts/run.sh --help). The collective benchmark: build/bin/tprun --nproc-per-node 2 comm_bench.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec build/bin/tprun --nproc-per-node 2 llama_train "$@"
