#!/usr/bin/env bash
# All tests: sets up and builds what is missing, then runs the C++ suite (threads-as-ranks and real
# multi-process runs through tprun) twice: with the same-host shared-memory backend (the default) and with
# DTENSOR_BACKEND=gloo, so both process-group backends pass everything.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
start=$(date +%s)
( cd build && ctest --output-on-failure )
echo "[test] all tests passed on the shared-memory backend in $(( $(date +%s) - start ))s; again on Gloo"
( cd build && DTENSOR_BACKEND=gloo ctest --output-on-failure )
echo "[test] all tests passed (shared memory and Gloo) in $(( $(date +%s) - start ))s"
