#!/bin/bash
# Builds dtensor-cpp into build-dev/ against the python3 torch of this machine (a GPU machine's own torch).
set -o pipefail
OUT=${OUT:-build-dev}; mkdir -p "$OUT"
nvidia-smi -L; nproc; gcc --version | head -1; cmake --version | head -1; ninja --version
TR=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
ABI=$(python3 -c "import torch;print(int(torch.compiled_with_cxx11_abi()))")
python3 -c "import torch;print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.nccl.version())"
echo "TORCH_ROOT=$TR ABI=$ABI"; ls $TR/include/gloo >/dev/null && echo "gloo headers ok"; ls $TR/../nvidia/
if [ ! -d /tmp/gtinst ]; then
  cmake -S ${GTEST_SRC:-/usr/src/googletest} -B /tmp/gt -G Ninja -DCMAKE_INSTALL_PREFIX=/tmp/gtinst -DBUILD_GMOCK=OFF >/dev/null && cmake --build /tmp/gt >/dev/null && cmake --install /tmp/gt >/dev/null && echo "gtest built"
fi
cmake -S . -B build-dev -G Ninja -DTORCH_ROOT=$TR -DDTENSOR_TORCH_CXX11_ABI=$ABI -DGTest_ROOT=/tmp/gtinst ${GLOO_INCLUDE:+-DDTENSOR_GLOO_INCLUDE=$GLOO_INCLUDE} -DCMAKE_BUILD_TYPE=Release ${EXTRA_CMAKE} > $OUT/configure.log 2>&1 || { tail -30 $OUT/configure.log; exit 1; }
grep -i "dtensor:" $OUT/configure.log
SECONDS=0
cmake --build build-dev -j"$(nproc)" ${TARGETS:+--target $TARGETS} > $OUT/build.log 2>&1; rc=$?
echo "build rc=$rc in ${SECONDS}s"; [ $rc = 0 ] || { grep -B2 -A12 "error" $OUT/build.log | head -150; exit 1; }
