#!/usr/bin/env bash
# All tests: sets up and builds what is missing, then runs the C++ suite (threads-as-ranks and real
# multi-process runs through tprun).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
start=$(date +%s)
( cd build && ctest --output-on-failure )
echo "[test] all tests passed in $(( $(date +%s) - start ))s"
