#!/bin/bash
# On a machine with a GPU and a CUDA PyTorch: builds dtensor-cpp against that torch (tools/gpu/build.sh), runs
# the CUDA tests, llama_train on the GPU, and the CUDA benchmarks beside PyTorch. What ran on the lent H100 is in
# docs/benchmarks.md (GPU sections). GTEST_SRC / GLOO_INCLUDE point at googletest sources / gloo headers if needed.
cd "$(dirname "$0")/../.."
OUT=$OUT; mkdir -p "$OUT"
TARGETS="dtensor_tests llama_tests llama_train dispatch_bench tprun dtensor_cuda" bash tools/gpu/build.sh > $OUT/build_out.log 2>&1 || { tail -40 $OUT/build_out.log; exit 1; }
grep "build rc" $OUT/build_out.log
B=$PWD/build-dev/bin
export OMP_NUM_THREADS=4
left() { [ $SECONDS -lt $1 ]; }
echo "=== dtensor_tests Cuda*"; timeout 90 $B/dtensor_tests --gtest_brief=1 --gtest_filter='Cuda*' > $OUT/cuda_tests.log 2>&1; echo "rc=$?"; grep -E "^\[  |Failure" $OUT/cuda_tests.log | head -12
echo "=== llama_tests LlamaCuda*"; timeout 150 $B/llama_tests --gtest_brief=1 --gtest_filter='LlamaCuda*:PagedGenerate.*' > $OUT/llama_cuda.log 2>&1; echo "rc=$?"; grep -E "^\[  |Failure|exception" $OUT/llama_cuda.log | cut -c1-300 | head -12
left 330 && { echo "=== tprun 2 llama_train --device cuda (gloo staging) 20 steps"; DTENSOR_CUDA_BACKEND=gloo timeout 60 $B/tprun --nproc-per-node 2 $B/llama_train --device cuda --steps 20 --log-every 10 2>&1 | tail -3; }
left 380 && { echo "=== dispatch overhead on cuda, world 1: ours, then PyTorch"; timeout 40 $B/tprun --nproc-per-node 1 $B/dispatch_bench --device cuda --iters 1000 2>&1 | tail -10
  (cd tools/bench && timeout 60 python3 -m torch.distributed.run --standalone --nproc-per-node 1 dispatch_bench.py --device cuda --iters 300 2>&1 | grep -v -i warn | tail -10); }
for cfg in "--dim 256 --layers 4 --heads 8 --kv-heads 4 --ffn-dim 768 --seq-len 64 --batch 4" "--dim 1024 --layers 8 --heads 16 --kv-heads 8 --ffn-dim 2816 --seq-len 512 --batch 8"; do
  left 480 || break
  echo "=== Llama step TP1 on cuda: $cfg"
  timeout 40 $B/tprun --nproc-per-node 1 $B/llama_train --device cuda $cfg --steps 20 --log-every 100 2>&1 | grep summary
  timeout 40 python3 tools/bench/llama_gpu_step_bench.py --device cuda $cfg --steps 20 2>&1 | grep summary
done
echo "total ${SECONDS}s"
