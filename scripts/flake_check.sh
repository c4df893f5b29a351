#!/usr/bin/env bash
# The tests that could fail by chance (multi-process, oracle, rendezvous, fault, async), N rounds under both
# backends beside a CPU hog, with a table of passes per test:  scripts/flake_check.sh N [--hogs H] [--only REGEX]
# Sets up and builds what is missing first (scripts/setup.sh). The bar is 0 failures at N >= 20.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: scripts/flake_check.sh N [--failure-paths] [--hogs H] [--only REGEX] [--backends shm,gloo] [--timeout S]" >&2; exit 2; }
./scripts/setup.sh
exec .venv/bin/python scripts/flake_check.py "$@"
