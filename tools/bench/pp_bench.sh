#!/usr/bin/env bash
# Pipeline parallelism's step time and bubble (issue 67), one invocation: llama_train at pp 1, tp 2 and pp 2 / 4 under
# each single-stage schedule (GPipe, 1F1B, ZBH1) with M = 2p and 4p microbatches, on one host (ranks as processes,
# Gloo point-to-point). Per row: the median step, the median time rank 0 waited in the schedule's receives (its
# bubble, measured: pp_wait / step), the schedule's simulated bubble (F = I = W, communication free) and the bytes rank 0
# sent or reduced per step. The step of pp p runs the same rows as pp 1: a pipeline on one host of 2 cores buys
# memory per rank (each holds 1/p of the layers), not time.
#
#   tools/bench/pp_bench.sh [build/bin] [steps]
set -euo pipefail
BIN=${1:-build/bin}
STEPS=${2:-12}
MODEL=(--dim 256 --layers 8 --heads 8 --kv-heads 4 --ffn-dim 768 --seq-len 128 --batch 16 --mixed-precision off
       --log-every 1000 --steps "$STEPS")
echo "lscpu: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores)"
printf "%-28s %10s %12s %10s %10s %14s %10s\n" layout "ms/step" "pp_wait_ms" "measured" simulated "bytes/step" loss
run() {
  local name=$1 nproc=$2; shift 2
  local out
  out=$(OMP_NUM_THREADS=1 timeout 900 "$BIN/tprun" --nproc-per-node "$nproc" --master-port 0 "$BIN/llama_train" "${MODEL[@]}" "$@" 2>&1)
  local summary sim
  summary=$(grep -o 'summary .*' <<<"$out" | tail -1)
  [ -n "$summary" ] || { echo "$name failed:"; tail -5 <<<"$out"; exit 1; }
  sim=$(grep -o 'bubble (simulated, F = I = W) [0-9.]*' <<<"$out" | awk '{print $NF}' || true)
  awk -v name="$name" -v sim="${sim:--}" '{
      for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "%-28s %10.1f %12.1f %10.3f %10s %14d %10.4f\n", name, v["median_step_ms"], v["median_pp_wait_ms"],
             v["median_pp_wait_ms"] / v["median_step_ms"], sim, v["comm_bytes_per_step"], v["final_loss"]
    }' <<<"$summary"
}
run "pp 1" 1
run "tp 2" 2 --tp 2
for pp in 2 4; do
  for schedule in GPipe 1F1B ZBH1; do
    for m in $((2 * pp)) $((4 * pp)); do
      run "pp $pp $schedule m $m" "$pp" --pp "$pp" --pp-schedule "$schedule" --pp-microbatches "$m" --tp 1
    done
  done
done
echo "summary pp_bench steps=$STEPS"
