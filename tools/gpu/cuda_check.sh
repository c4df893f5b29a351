#!/bin/bash
# On a machine with a GPU and a CUDA PyTorch: builds dtensor-cpp against that torch (tools/gpu/build.sh), then, most
# wanted first, each step under `timeout` and skipped when it could not end inside BUDGET seconds (default 480, the
# build included): the CUDA tests; serve on the GPU against transformers (tests/inference/serve_ep_test.py, a tiny
# Mixtral); llama_generate on cuda vs cpu; llama_train on the GPU in fp32, bf16 (--dtype), bf16 mixed precision and
# float8 (torchao's recipe, at::_scaled_mm),
# and TP 2 host-staged; the CUDA benchmarks beside PyTorch. What ran on the lent H100 is in docs/benchmarks.md (GPU
# sections). A lent machine lacks Debian's packages and the `openai` client: carry .devdeps (tools/gpu/devdeps.sh):
#   run: OUT=$OUT bash tools/gpu/cuda_check.sh   with carry [".devdeps"], timeout_s 600
# Logs under $OUT (7 files): check.log (all this prints), configure.log, build.log, tests.log, serve.log, runs.log,
# bench.log. GTEST_SRC / GLOO_INCLUDE / EXTRA_CMAKE pass through to build.sh.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu}; mkdir -p "$OUT"
BUDGET=${BUDGET:-480}
B=$PWD/build-dev/bin

# step SECS LOG LABEL CMD...: prints "=== LABEL" and CMD's exit status; CMD's output goes to /tmp/step.out and is
# appended to $OUT/LOG. Skipped (status 99) when SECS more would pass BUDGET.
step() {
  local secs=$1 log=$2 label=$3 t0=$SECONDS rc; shift 3
  echo "=== $label"
  : > /tmp/step.out
  if ((SECONDS + secs > BUDGET)); then echo "skipped: ${SECONDS}s of ${BUDGET}s used"; return 99; fi
  echo "=== $label: $*" >> "$OUT/$log"
  timeout -k 10 "$secs" "$@" > /tmp/step.out 2>&1; rc=$?
  cat /tmp/step.out >> "$OUT/$log"
  echo "rc=$rc in $((SECONDS - t0))s" | tee -a "$OUT/$log"
  return $rc
}

main() {
  if ls .devdeps/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devdeps/whl/*.whl \
      2>&1 | { grep -v -i "warning" || true; }
    python3 -c "import sys; sys.path.insert(0, '/tmp/site'); import openai; print('openai', openai.__version__, 'in /tmp/site')" \
      || echo "openai: not importable (serve_ep_test will fail)"
  fi
  source tools/gpu/devdeps_env.sh  # LD_LIBRARY_PATH for the programs, as build.sh had it
  TARGETS="dtensor_tests llama_tests llama_train llama_generate serve dispatch_bench tprun dtensor_cuda" \
    bash tools/gpu/build.sh || echo "build failed: running what was built (a missing program's step says rc=127)"
  [ -x $B/tprun ] || { echo "no tprun: nothing to run"; return 1; }
  export OMP_NUM_THREADS=4

  # --- the CUDA tests
  step 90 tests.log "dtensor_tests Cuda*" $B/dtensor_tests --gtest_brief=1 --gtest_filter='Cuda*'
  grep -E "^\[  |Failure" /tmp/step.out | head -12
  step 150 tests.log "llama_tests LlamaCuda*:PagedGenerate.*" \
    $B/llama_tests --gtest_brief=1 --gtest_filter='LlamaCuda*:PagedGenerate.*'
  grep -E "^\[  |Failure|exception" /tmp/step.out | cut -c1-300 | head -12

  # --- serve on the GPU: a tiny Mixtral served at EP 2, TP 2, TP 1 (ranks sharing cuda:0, host-staged), greedy texts
  #     equal transformers'
  if [ -x $B/serve ]; then
    step 180 serve.log "serve_ep_test --device cuda" env PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 \
      python3 tests/inference/serve_ep_test.py $B --device cuda
    rc=$?
    grep -E "^(ok|FAIL|summary)|^  |Error|error:" /tmp/step.out | cut -c1-400 | head -30
    [ $rc = 0 ] || [ $rc = 99 ] || tail -25 /tmp/step.out | cut -c1-400
  else
    echo "=== serve_ep_test: serve was not built (configure.log says why)"
  fi

  # --- llama_generate, random weights, greedy: cuda vs cpu (float32), then bf16 on cuda
  local gen="--random-init --prompt-ids 1,2,3 --max-new-tokens 8"
  step 60 runs.log "llama_generate --device cuda" $B/tprun --nproc-per-node 1 $B/llama_generate --device cuda $gen
  cat /tmp/step.out; grep -o '\[0\] .*' /tmp/step.out > /tmp/gen_cuda.txt
  step 60 runs.log "llama_generate --device cpu" $B/tprun --nproc-per-node 1 $B/llama_generate --device cpu $gen
  cat /tmp/step.out; grep -o '\[0\] .*' /tmp/step.out > /tmp/gen_cpu.txt
  if [ -s /tmp/gen_cuda.txt ] && cmp -s /tmp/gen_cuda.txt /tmp/gen_cpu.txt; then echo "llama_generate: cuda tokens == cpu tokens"
  else echo "llama_generate: cuda and cpu tokens DIFFER (or a run failed)"; fi
  step 60 runs.log "llama_generate --device cuda --dtype bfloat16" \
    $B/tprun --nproc-per-node 1 $B/llama_generate --device cuda --dtype bfloat16 $gen
  grep -E '\[0\] |summary|error' /tmp/step.out

  # --- llama_train on the GPU, 20 steps of the default model: fp32, bf16 throughout, bf16 mixed precision
  #     (fp32 masters); then TP 2 as two processes sharing the GPU (host-staged)
  for mode in "--mixed-precision off" "--dtype bfloat16 --mixed-precision off" "--mixed-precision bf16" "--float8"; do
    step 60 runs.log "llama_train --device cuda $mode" \
      $B/tprun --nproc-per-node 1 $B/llama_train --device cuda $mode --steps 20 --log-every 10
    grep -E "step +[0-9]+ +loss|summary|error" /tmp/step.out | cut -c1-300
  done
  step 60 runs.log "tprun 2 llama_train --device cuda (gloo staging) 20 steps" \
    env DTENSOR_CUDA_BACKEND=gloo $B/tprun --nproc-per-node 2 $B/llama_train --device cuda --steps 20 --log-every 10
  tail -3 /tmp/step.out

  # --- benchmarks, ours then PyTorch's
  step 40 bench.log "dispatch overhead on cuda, world 1: ours" \
    $B/tprun --nproc-per-node 1 $B/dispatch_bench --device cuda --iters 1000
  tail -10 /tmp/step.out
  step 60 bench.log "dispatch overhead on cuda, world 1: PyTorch" bash -c \
    "cd tools/bench && python3 -m torch.distributed.run --standalone --nproc-per-node 1 dispatch_bench.py --device cuda --iters 300"
  grep -v -i warn /tmp/step.out | tail -10
  for cfg in "--dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn-dim 768 --seq-len 64 --batch 4" \
             "--dim 1024 --layers 8 --heads 16 --kv-heads 8 --ffn-dim 2816 --seq-len 512 --batch 8"; do
    step 40 bench.log "Llama step TP1 on cuda, ours: $cfg" \
      $B/tprun --nproc-per-node 1 $B/llama_train --device cuda $cfg --steps 20 --log-every 100
    grep summary /tmp/step.out
    step 40 bench.log "Llama step TP1 on cuda, PyTorch: $cfg" \
      python3 tools/bench/llama_gpu_step_bench.py --device cuda $cfg --steps 20
    grep summary /tmp/step.out
  done
  echo "total ${SECONDS}s"
}

set -o pipefail
main 2>&1 | tee "$OUT/check.log"
