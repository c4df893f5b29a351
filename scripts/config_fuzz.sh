#!/usr/bin/env bash
# The config fuzz beyond the seeds CI runs (ctest's config_fuzz_vs_hf runs seeds 0,1): checkpoints saved by
# transformers with every family's numerics fields drawn from each seed, greedy tokens against transformers at
# TP 1 and 2 (tests/oracle/hf_config_fuzz.py). Ends with a summary line; exit 1 on a run that answers differently.
#
#   ./scripts/config_fuzz.sh [SEEDS] [hf_config_fuzz.py flags]     SEEDS: 2-41 (default), or 5,7,9
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh >/dev/null
seeds=${1:-2-41}
[ $# -gt 0 ] && shift
HF_HUB_OFFLINE=1 exec .venv/bin/python tests/oracle/hf_config_fuzz.py run --bin build/bin --seeds "$seeds" "$@"
