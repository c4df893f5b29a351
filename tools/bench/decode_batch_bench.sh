#!/usr/bin/env bash
# Decode speed at a batch size: llama_generate on an HF checkpoint (real_size_checkpoint.py writes the random ones of
# real shapes), a 32-token prompt repeated BATCH times, 16 greedy tokens, TP ranks with 2 / TP threads each. Prints
# llama_generate's summary line (prefill_ms, ms_per_token: one decode step of the whole batch, tokens_per_s).
#   tools/bench/decode_batch_bench.sh BIN_DIR TP BATCH [CHECKPOINT_DIR (default /tmp/real_sizes/llama3.2-1b)] [QUANTIZE
#   (llama_generate --quantize: none, int8, int4, int4-G; default none)]
# Run two builds' BIN_DIRs alternately for a before / after (docs/benchmarks.md, "bf16 decode on a CPU without AVX-512").
set -euo pipefail
BIN=$1 TP=$2 B=$3 CKPT=${4:-/tmp/real_sizes/llama3.2-1b} QUANTIZE=${5:-none}
IDS=$(python3 -c "print(','.join(str(i * 37 % 1000 + 5) for i in range(32)))")
OMP_NUM_THREADS=$((2 / TP > 0 ? 2 / TP : 1)) "$BIN/tprun" --nproc-per-node "$TP" --master-port 0 "$BIN/llama_generate" \
  --hf-dir "$CKPT" --dtype bfloat16 --prompt-ids "$IDS" --max-new-tokens 16 --batch "$B" --quantize "$QUANTIZE" --no-stream 2>&1 |
  grep -o "summary.*" | head -1
