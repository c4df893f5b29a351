#!/usr/bin/env bash
# llama.cpp's CPU backend as a benchmark peer (never a test dependency). The only source reachable here is PyPI, so
# the llama.cpp tree vendored in the llama-cpp-python sdist (vendor/llama.cpp) is built in .peers/llamacpp/, and only
# the two tools the benchmark needs: llama-bench and llama-quantize. Idempotent: prints the build's bin directory.
#   tools/bench/peers/llamacpp_setup.sh        # -> .peers/llamacpp/build/bin  (.peers/llamacpp/llama.cpp: the tree)
# Build choices: Release, GGML_NATIVE=ON (-march=native: AVX-512, VNNI, BF16 on this Xeon), GGML_OPENMP=ON (the
# threading the project also uses), GGML_CCACHE=OFF (leave the project's ccache alone). -march=native also turns on
# AMX, and on this Sapphire Rapids VM ggml's AMX matmul (Q4_0/Q8_0 weights, batches > 1) dies of SIGILL at its first
# tileloadd (pp32 crashes; tg16 survives, as single-token decode takes the AVX512-VNNI path). So AMX is compiled out
# (-mno-amx-*; there is no GGML_AMX switch under GGML_NATIVE); LLAMACPP_AMX=1 keeps it (delete .peers/llamacpp/build
# to switch). LLAMA_CURL is gone upstream (deprecated, ignored); LLAMA_OPENSSL=OFF keeps the download code TLS-free.
set -euo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
root=$repo/.peers/llamacpp
bin=$root/build/bin
log() { echo "[llamacpp_setup] $*" >&2; }
if [[ ! -x $bin/llama-bench || ! -x $bin/llama-quantize ]]; then
  mkdir -p "$root"
  if ! compgen -G "$root/llama_cpp_python-*.tar.gz" >/dev/null; then
    log "downloading the llama-cpp-python sdist (once; ~80 MB)"
    nice -n 19 "$repo/.venv/bin/pip" download -q --no-deps --no-binary :all: -d "$root" llama-cpp-python >&2
  fi
  sdist=$(ls "$root"/llama_cpp_python-*.tar.gz | sort -V | tail -n1)
  src=${sdist%.tar.gz}
  if [[ ! -f $src/vendor/llama.cpp/CMakeLists.txt ]]; then
    log "extracting $(basename "$sdist")"
    rm -rf "$src" "$root/extract" && mkdir "$root/extract"
    tar -xzf "$sdist" -C "$root/extract" && mv "$root/extract/$(basename "$src")" "$src" && rmdir "$root/extract"
  fi
  ln -sfn "$src/vendor/llama.cpp" "$root/llama.cpp"
  flags=()
  [[ ${LLAMACPP_AMX:-0} == 0 ]] && flags+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
                                         "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
  log "configuring and building llama-bench, llama-quantize in $root/build"
  "$repo/.venv/bin/cmake" -S "$root/llama.cpp" -B "$root/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_CCACHE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF ${flags[@]+"${flags[@]}"} >&2
  nice -n 19 "$repo/.venv/bin/cmake" --build "$root/build" --target llama-bench llama-quantize -j2 >&2
fi
echo "$bin"
