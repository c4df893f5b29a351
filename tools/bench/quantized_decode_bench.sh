#!/usr/bin/env bash
# Weight-only quantized decode, ours beside llama.cpp in one invocation, on the same weights:
#  - ours from the bf16 checkpoint: llama_generate --quantize none / int8 / int4 (decode_batch_bench.sh: a 32-token
#    prompt, 16 greedy tokens, decode time only) at each TP degree and batch size;
#  - ours and llama.cpp's llama-bench (tg16: 16 tokens after no prompt, 2 threads) on llama.cpp's own GGUF files of
#    those weights (peers/llamacpp_setup.sh builds it, peers/llamacpp_gguf.sh converts and quantizes): Q8_0 (ours
#    dequantizes it, then --quantize int8 per row) and Q4_0 (ours keeps the Q4_0 Linear weights as they are stored,
#    int4 in groups of 32; --quantize int8 makes the Q6_K token embedding's tied lm_head int8); BF16 for reference.
#   tools/bench/quantized_decode_bench.sh [CHECKPOINT (default /tmp/real_sizes/llama3.2-1b)] [BATCHES (1,8)] [TPS (1,2)]
set -euo pipefail
cd "$(dirname "$0")/../.."
CKPT=${1:-/tmp/real_sizes/llama3.2-1b} BATCHES=${2:-1,8} TPS=${3:-1,2}
echo "# $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores"
[ -f "$CKPT/config.json" ] || .venv/bin/python tools/bench/real_size_checkpoint.py "$CKPT" --shape llama3.2-1b | tail -1
for tp in ${TPS//,/ }; do
  for b in ${BATCHES//,/ }; do
    for q in none int8 int4; do
      echo "ours hf-dir quantize=$q B=$b tp=$tp $(tools/bench/decode_batch_bench.sh build/bin "$tp" "$b" "$CKPT" "$q")"
    done
  done
done
LLAMACPP=$(tools/bench/peers/llamacpp_setup.sh | tail -1)
GGUF="${CKPT%/}-gguf"
tools/bench/peers/llamacpp_gguf.sh "$CKPT" "$GGUF" >&2
IDS=$(python3 -c "print(','.join(str(i * 37 % 1000 + 5) for i in range(32)))")
for quant in q8_0 q4_0; do
  for tp in ${TPS//,/ }; do
    out=$(OMP_NUM_THREADS=$((2 / tp > 0 ? 2 / tp : 1)) build/bin/tprun --nproc-per-node "$tp" --master-port 0 \
      build/bin/llama_generate --gguf "$GGUF/model-$quant.gguf" --quantize int8 --prompt-ids "$IDS" \
      --max-new-tokens 16 --no-stream 2>&1)
    echo "ours gguf $quant --quantize int8 B=1 tp=$tp $(grep -o "summary.*" <<<"$out" | head -1 | grep -oE "(ms_per_token|prefill_ms|load_ms)=[^ ]*" | tr '\n' ' ')"
  done
done
for quant in bf16 q8_0 q4_0; do
  "$LLAMACPP/llama-bench" -m "$GGUF/model-$quant.gguf" -p 0 -n 16 -t 2 -r 3 -o csv 2>/dev/null |
    awk -F, -v q="$quant" 'NR > 1 { gsub(/"/, ""); printf "llama.cpp %s tg16 tokens_per_s=%s ms_per_token=%.1f\n", q, $(NF - 1), 1000 / $(NF - 1) }' |
    tail -1
done
echo "summary quantized_decode_bench checkpoint=$CKPT batches=$BATCHES tps=$TPS"
