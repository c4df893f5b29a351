#!/usr/bin/env bash
# All tests: sets up and builds what is missing, then runs the C++ suite (threads-as-ranks and real
# multi-process runs through tprun) twice: with the same-host shared-memory backend (the default) and with
# DTENSOR_BACKEND=gloo, so both process-group backends pass everything that uses one.
#
# The first pass runs everything and records, per gtest binary and filter, the test suites that made a real
# process group or launched a process (tests/harness/gtest_main.cpp). The Gloo pass runs those suites and every
# ctest entry that is not a gtest binary (Python oracles, launches) except those labelled backend_independent; the
# other suites (tokenizers, configs, dry runs on a fake world) run the same code on either backend and are not run
# twice.
# Two entries run at once (DTENSOR_TEST_JOBS, default 2): they spend much of their time waiting (launches,
# rendezvous, timeouts), and each bounds its waits for a loaded machine (scripts/flake_check.sh runs them beside CPU
# hogs). DTENSOR_TEST_JOBS=1: one at a time.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
start=$(date +%s)
record=$PWD/build/backend_suites.txt
rm -f "$record"
jobs=${DTENSOR_TEST_JOBS:-2}
( cd build && DTENSOR_TEST_RECORD_BACKEND_SUITES=$record ctest -j"$jobs" --output-on-failure )
touch "$record"  # no suite used a backend: the Gloo pass runs no gtest, never everything by accident
echo "[test] all tests passed on the shared-memory backend in $(( $(date +%s) - start ))s; again on Gloo" \
     "($(sort -u "$record" | wc -l) gtest suites that use a process group, and the other entries)"
# -LE backend_independent: PyTorch's oracle generators and the layer check, which no backend touches; -FS oracle:
# their files from the first pass serve oracle_tests (ctest would otherwise add the fixture's setup tests back).
( cd build && DTENSOR_BACKEND=gloo DTENSOR_TEST_ONLY_BACKEND_SUITES=$record \
    ctest -j"$jobs" --output-on-failure -LE backend_independent -FS oracle )
echo "[test] all tests passed (shared memory and Gloo) in $(( $(date +%s) - start ))s"
