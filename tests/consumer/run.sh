#!/usr/bin/env bash
# ctest `install_and_consume`: what a new user does with the library, from a clean environment.
#   1. install the build into a fresh prefix;
#   2. check that no installed header or CMake file needs gloo (the build found gloo's headers; users don't);
#   3. configure and build tests/consumer (find_package(dtensor), no C++ standard set, no TORCH_ROOT given)
#      against the prefix, with a poisoned gloo/ include dir in front so any gloo include fails;
#   4. run, with no LD_LIBRARY_PATH and no venv on PATH, the installed tprun on the consumer (2 ranks) and on
#      the installed comm_bench (2 ranks, one tiny size).
# Usage: run.sh <dtensor build dir> <this dir> <cmake executable>
set -euo pipefail
build=$1 src=$2 cmake=$3
work="$build/install_test"          # stable path (under ccache's base_dir), so reruns hit the cache
rm -rf "$work"
mkdir -p "$work/poison/gloo/rendezvous" "$work/poison/gloo/transport" "$work/poison/gloo/common"
prefix="$work/prefix"
fail() { echo "install_and_consume: FAILED: $*" >&2; exit 1; }
# A fresh shell: no venv on PATH, no LD_LIBRARY_PATH (HOME kept: ccache's configuration lives there).
clean_env=(env -i "PATH=/usr/local/bin:/usr/bin:/bin" "HOME=${HOME:-/tmp}")

echo "== install into $prefix"
"$cmake" --install "$build" --prefix "$prefix" >/dev/null

echo "== installed headers and CMake files need no gloo"
if grep -rlE '#include *[<"](gloo/|torch/csrc/distributed/c10d/ProcessGroupGloo)' "$prefix/include"; then
  fail "installed headers above include gloo"
fi
if grep -lE 'DTENSOR_GLOO|USE_C10D_GLOO|gloo/' "$prefix"/lib/cmake/dtensor/*.cmake; then
  fail "the exported CMake files above ask for gloo"
fi
for h in config.h algorithm.h context.h rendezvous/store.h transport/device.h common/error.h; do
  echo '#error "a dtensor consumer must not need gloo headers"' > "$work/poison/gloo/$h"
done

echo "== configure and build tests/consumer against the installed package (clean environment)"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
"${clean_env[@]}" "$cmake" -S "$src" -B "$work/build" -Ddtensor_DIR="$prefix/lib/cmake/dtensor" \
  -DCMAKE_CXX_FLAGS="-I$work/poison" "${launcher[@]}" >"$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; fail "configure"; }
"${clean_env[@]}" "$cmake" --build "$work/build" -j1 >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }

echo "== installed tprun runs the consumer on 2 ranks"
out=$("${clean_env[@]}" DTENSOR_TIMEOUT_SEC=60 "$prefix/bin/tprun" --nproc-per-node 2 --master-port 0 \
      "$work/build/consumer" 2>&1) || { echo "$out"; fail "consumer run"; }
echo "$out"
[ "$(grep -c 'consumer ok: world 2, sum 56' <<<"$out")" = 2 ] || fail "consumer output"

echo "== installed tprun runs the installed comm_bench on 2 ranks"
out=$("${clean_env[@]}" DTENSOR_TIMEOUT_SEC=60 "$prefix/bin/tprun" --nproc-per-node 2 --master-port 0 \
      comm_bench --min-bytes 1024 --max-bytes 1024 --iters 2 --warmup 1 2>&1) || { echo "$out"; fail "comm_bench run"; }
echo "$out"
grep -q '# all_reduce' <<<"$out" || fail "comm_bench output"
echo "install_and_consume: OK"
