#!/usr/bin/env bash
# Batched decode, ours beside vLLM's CPU engine in one invocation: for each TP degree, ours at every batch size
# (decode_batch_bench.sh: llama_generate, a 32-token prompt, 16 greedy tokens, decode time only), then vLLM's
# (peers/vllm_decode.py: offline LLM.generate from the same prompt ids, prefix caching off, decode time only).
#   tools/bench/decode_vs_vllm.sh [CHECKPOINT (default /tmp/real_sizes/llama3.2-1b)] [BATCHES (1,8,32,64)] [TPS (1,2)]
# The checkpoint: tools/bench/real_size_checkpoint.py. vLLM is installed on first use (peers/vllm_setup.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
CKPT=${1:-/tmp/real_sizes/llama3.2-1b} BATCHES=${2:-1,8,32,64} TPS=${3:-1,2}
VLLM=$(tools/bench/peers/vllm_setup.sh)
echo "# $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores"
for tp in ${TPS//,/ }; do
  for b in ${BATCHES//,/ }; do
    echo "ours B=$b tp=$tp $(tools/bench/decode_batch_bench.sh build/bin "$tp" "$b" "$CKPT")"
  done
  "$VLLM" tools/bench/peers/vllm_decode.py --model "$CKPT" --batch "$BATCHES" --tp "$tp" 2>/dev/null | grep -E "^vllm B="
done
echo "summary decode_vs_vllm checkpoint=$CKPT batches=$BATCHES tps=$TPS"
