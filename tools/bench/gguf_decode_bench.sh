#!/usr/bin/env bash
# GGUF files as the model source, at real size: the Llama-3.2-1B-shaped random checkpoint (real_size_checkpoint.py)
# converted by hf_to_gguf.py into each TYPE, then llama_generate --gguf (dequantized to bf16; and with --quantize int8)
# beside --hf-dir on the bf16 files, at each TP degree: a 32-token prompt, 16 greedy tokens, decode time only, TP ranks
# with 2 / TP threads each. Prints llama_generate's summary fields and each rank's peak RSS (/usr/bin/time).
#   tools/bench/gguf_decode_bench.sh [CHECKPOINT (default /tmp/real_sizes/llama3.2-1b)] [TYPES (Q8_0,Q4_0)] [TPS (1,2)]
set -euo pipefail
cd "$(dirname "$0")/../.."
CKPT=${1:-/tmp/real_sizes/llama3.2-1b} TYPES=${2:-Q8_0,Q4_0} TPS=${3:-1,2}
echo "# $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores"
[ -f "$CKPT/config.json" ] || .venv/bin/python tools/bench/real_size_checkpoint.py "$CKPT" --shape llama3.2-1b | tail -1
for type in ${TYPES//,/ }; do
  [ -f "${CKPT%/}-$type.gguf" ] || .venv/bin/python tools/bench/hf_to_gguf.py "$CKPT" "${CKPT%/}-$type.gguf" --type "$type" | tail -1
done
IDS=$(python3 -c "print(','.join(str(i * 37 % 1000 + 5) for i in range(32)))")
run() {  # label, then llama_generate's source flags
  local label=$1 tp=$2
  shift 2
  out=$(OMP_NUM_THREADS=$((2 / tp > 0 ? 2 / tp : 1)) build/bin/tprun --nproc-per-node "$tp" --master-port 0 /usr/bin/time \
    -f "maxrss_kb=%M" build/bin/llama_generate "$@" --prompt-ids "$IDS" --max-new-tokens 16 --no-stream 2>&1)
  summary=$(grep -o "summary.*" <<<"$out" | head -1)
  field() { grep -o " $1=[^ ]*" <<<" $summary" | cut -d= -f2; }
  rss=$(grep -o "maxrss_kb=[0-9]*" <<<"$out" | cut -d= -f2 | sort -n | tail -1)
  echo "$label tp=$tp ms_per_token=$(field ms_per_token) prefill_ms=$(field prefill_ms) load_ms=$(field load_ms) dtype=$(field dtype) quantize=$(field quantize) peak_rss_gb_per_rank=$(awk -v k="${rss:-0}" 'BEGIN { printf "%.2f", k / 1048576 }')"
}
for tp in ${TPS//,/ }; do
  run "hf-dir bf16" "$tp" --hf-dir "$CKPT" --dtype bfloat16
  for type in ${TYPES//,/ }; do
    run "gguf $type" "$tp" --gguf "${CKPT%/}-$type.gguf"
    run "gguf $type --quantize int8" "$tp" --gguf "${CKPT%/}-$type.gguf" --quantize int8
  done
done
echo "summary gguf_decode_bench checkpoint=$CKPT types=$TYPES tps=$TPS"
