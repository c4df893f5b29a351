#!/usr/bin/env bash
# The main job with built-in defaults: a Llama-3-style model trained under torchtitan's tensor + sequence
# parallel plan across 2 processes (tprun --nproc-per-node 2 llama_train), checkpointed to runs/llama with the
# model's byte tokenizer beside it. Options go to llama_train (./scripts/run.sh --help lists them).
#   ./scripts/run.sh generate [llama_generate options]   trains nothing: the trained model speaks (TP 2, from the
#       newest checkpoint in runs/llama; prompt "Everyone is permitted to copy", 120 new tokens, temperature 0.8,
#       top-k 20, seed 1: each can be given to replace it; your own --prompt replaces the default prompt)
#   ./scripts/run.sh serve [serve options]                serves the trained model over the OpenAI API at TP 2 on
#       http://127.0.0.1:8000 (--port to change), with the byte tokenizer that ships with it
# The setup and build step runs first unless the programs are already built (--help, generate and serve on a built
# tree start at once).
# The collective benchmark: build/bin/tprun --nproc-per-node 2 comm_bench.
set -euo pipefail
cd "$(dirname "$0")/.."
built() { [[ -x build/bin/tprun && -x build/bin/llama_train && -x build/bin/llama_generate && -x build/bin/serve ]]; }
case "${1:-}" in
  --help|-h)
    if built; then
      echo "usage: ./scripts/run.sh [llama_train options] | generate [llama_generate options] | serve [serve options]"
      echo
      exec build/bin/llama_train --help
    fi
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    echo
    echo "(llama_train's own options are listed once the tree is built: run ./scripts/run.sh once, or ./scripts/setup.sh)"
    exit 0
    ;;
  generate|serve)
    mode=$1
    shift
    if [[ ! -f runs/llama/config.json ]]; then
      echo "run.sh $mode: no trained model in runs/llama yet: run ./scripts/run.sh first" >&2
      exit 2
    fi
    built || ./scripts/setup.sh
    if [[ $mode == generate ]]; then
      prompt=(--prompt "Everyone is permitted to copy")
      for a in "$@"; do
        case $a in --prompt|--prompt=*|--prompt-ids|--prompt-ids=*|--chat|--chat=*) prompt=() ;; esac
      done
      exec build/bin/tprun --nproc-per-node 2 llama_generate --checkpoint runs/llama \
        "${prompt[@]}" --max-new-tokens 120 --temperature 0.8 --top-k 20 --seed 1 "$@"
    fi
    if [[ ! -f runs/llama/tokenizer.json ]]; then
      echo "run.sh serve: runs/llama has no tokenizer.json (trained before llama_train wrote one): run ./scripts/run.sh again" >&2
      exit 2
    fi
    exec build/bin/tprun --nproc-per-node 2 serve --checkpoint runs/llama --tokenizer runs/llama --model-name llama "$@"
    ;;
esac
./scripts/setup.sh
exec build/bin/tprun --nproc-per-node 2 llama_train --checkpoint-dir runs/llama --checkpoint-every 100 "$@"
