#!/usr/bin/env bash
# The main job with built-in defaults: the collective benchmark across 2 processes on this machine.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec build/bin/tprun --nproc-per-node 2 comm_bench "$@"
