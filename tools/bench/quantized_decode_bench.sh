#!/usr/bin/env bash
# Weight-only int8 decode, ours beside llama.cpp in one invocation: ours (llama_generate --quantize none / int8,
# decode_batch_bench.sh: a 32-token prompt, 16 greedy tokens, decode time only) at each TP degree and batch size, then
# llama.cpp's llama-bench (tg16: 16 tokens decoded after no prompt, 2 threads) on the same weights in BF16, Q8_0 and
# Q4_0 GGUF files (peers/llamacpp_setup.sh builds it, peers/llamacpp_gguf.sh converts and quantizes).
#   tools/bench/quantized_decode_bench.sh [CHECKPOINT (default /tmp/real_sizes/llama3.2-1b)] [BATCHES (1,8)] [TPS (1,2)]
set -euo pipefail
cd "$(dirname "$0")/../.."
CKPT=${1:-/tmp/real_sizes/llama3.2-1b} BATCHES=${2:-1,8} TPS=${3:-1,2}
echo "# $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores"
for tp in ${TPS//,/ }; do
  for b in ${BATCHES//,/ }; do
    for q in none int8; do
      echo "ours quantize=$q B=$b tp=$tp $(tools/bench/decode_batch_bench.sh build/bin "$tp" "$b" "$CKPT" "$q")"
    done
  done
done
LLAMACPP=$(tools/bench/peers/llamacpp_setup.sh | tail -1)
GGUF="${CKPT%/}-gguf"
tools/bench/peers/llamacpp_gguf.sh "$CKPT" "$GGUF" >&2
for quant in bf16 q8_0 q4_0; do
  "$LLAMACPP/llama-bench" -m "$GGUF/model-$quant.gguf" -p 0 -n 16 -t 2 -r 3 -o csv 2>/dev/null |
    awk -F, -v q="$quant" 'NR > 1 { gsub(/"/, ""); printf "llama.cpp %s tg16 tokens_per_s=%s ms_per_token=%.1f\n", q, $(NF - 1), 1000 / $(NF - 1) }' |
    tail -1
done
echo "summary quantized_decode_bench checkpoint=$CKPT batches=$BATCHES tps=$TPS"
