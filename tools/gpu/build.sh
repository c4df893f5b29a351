#!/bin/bash
# Builds dtensor-cpp into build-dev/ against the python3 torch of this machine (a GPU machine's own torch).
# TARGETS: the targets to build (default all); one the configure step did not make (serve without cpp-httplib) is
# skipped with a line. With .devdeps/ in the work tree (tools/gpu/devdeps.sh; tools/gpu/devdeps_env.sh) what it
# carries stands in for the Debian packages the machine lacks: PCRE2, utf8proc, sentencepiece, nlohmann-json, CLI11,
# cpp-httplib, zlib's headers, gloo's headers, googletest's sources. GTEST_SRC / GLOO_INCLUDE / EXTRA_CMAKE override.
set -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build-dev}; mkdir -p "$OUT"
source tools/gpu/devdeps_env.sh
nvidia-smi -L; nproc; gcc --version | head -1; cmake --version | head -1; ninja --version
TR=$(python3 -c "import torch,os;print(os.path.dirname(torch.__file__))")
ABI=$(python3 -c "import torch;print(int(torch.compiled_with_cxx11_abi()))")
python3 -c "import torch;print('torch', torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.cuda.nccl.version())"
echo "TORCH_ROOT=$TR ABI=$ABI"; ls $TR/include/gloo >/dev/null 2>&1 && echo "gloo headers ok"; ls $TR/../nvidia/
DD=()
if [ -n "${DEVDEPS:-}" ]; then
  # find_library / find_path (pcre2-8, utf8proc, sentencepiece, CLI/CLI.hpp) and the plain includes (nlohmann).
  DD+=("-DCMAKE_PREFIX_PATH=$DEVDEPS" "-DCMAKE_CXX_FLAGS=-isystem $DEVDEPS/include")
  if [ -z "${GLOO_INCLUDE:-}" ] && [ ! -e "$TR/include/gloo/rendezvous/store.h" ] && [ ! -e /usr/include/gloo/rendezvous/store.h ] \
     && [ ! -e /usr/local/include/gloo/rendezvous/store.h ]; then
    GLOO_INCLUDE=$DEVDEPS/gloo
  fi
  if [ ! -e /usr/include/zlib.h ] && [ ! -e /usr/local/include/zlib.h ]; then
    # zlib's headers from .devdeps, the machine's own libz.so.1 (the one python3 has mapped, else ldconfig's).
    zlib=$(python3 -c "import zlib; print(next((l.split()[-1] for l in open('/proc/self/maps') if '/libz.so' in l), ''))")
    [ -n "$zlib" ] || zlib=$(ldconfig -p 2>/dev/null | awk '/libz\.so\.1 .*x86-64/{print $NF; exit}')
    [ -n "$zlib" ] || zlib=$DEVDEPS/fallback/libz.so.1
    echo "zlib: headers from .devdeps, library $zlib"
    DD+=("-DZLIB_INCLUDE_DIR=$DEVDEPS/zlib/include" "-DZLIB_LIBRARY=$zlib")
  fi
  if ! pkg-config --exists cpp-httplib 2>/dev/null; then
    # Debian's compiled cpp-httplib, used as its cpp-httplib.pc says (Cflags' definitions and what they include).
    DD+=("-DDTENSOR_HTTPLIB_INCLUDE=$DEVDEPS/httplib/include;$DEVDEPS/zlib/include"
         "-DDTENSOR_HTTPLIB_LIBRARY=$DEVDEPS/lib/libcpp-httplib.so"
         "-DDTENSOR_HTTPLIB_DEFINITIONS=CPPHTTPLIB_OPENSSL_SUPPORT;CPPHTTPLIB_ZLIB_SUPPORT;CPPHTTPLIB_BROTLI_SUPPORT")
  fi
fi
if [ ! -d /tmp/gtinst ]; then
  cmake -S ${GTEST_SRC:-/usr/src/googletest} -B /tmp/gt -G Ninja -DCMAKE_INSTALL_PREFIX=/tmp/gtinst -DBUILD_GMOCK=OFF >/dev/null && cmake --build /tmp/gt >/dev/null && cmake --install /tmp/gt >/dev/null && echo "gtest built"
fi
cmake -S . -B build-dev -G Ninja -DTORCH_ROOT=$TR -DDTENSOR_TORCH_CXX11_ABI=$ABI -DGTest_ROOT=/tmp/gtinst ${GLOO_INCLUDE:+-DDTENSOR_GLOO_INCLUDE=$GLOO_INCLUDE} -DCMAKE_BUILD_TYPE=Release "${DD[@]}" ${EXTRA_CMAKE} > $OUT/configure.log 2>&1 || { tail -30 $OUT/configure.log; exit 1; }
grep -i "dtensor:" $OUT/configure.log
if [ -n "$TARGETS" ]; then
  known=$(ninja -C build-dev -t targets all 2>/dev/null | sed 's/:.*//')
  kept=""
  for t in $TARGETS; do
    if grep -qxF "$t" <<<"$known"; then kept="$kept $t"; else echo "target $t was not configured: not built"; fi
  done
  TARGETS=${kept# }
fi
SECONDS=0
# -k 0: a target that fails to compile leaves the others built (the exit status still says it failed).
cmake --build build-dev -j"$(nproc)" ${TARGETS:+--target $TARGETS} -- -k 0 > $OUT/build.log 2>&1; rc=$?
echo "build rc=$rc in ${SECONDS}s"; [ $rc = 0 ] || { grep -B2 -A12 "error" $OUT/build.log | head -150; exit 1; }
