#!/usr/bin/env bash
# Idempotent setup: Debian packages, the project venv with torch 2.14.1 (LibTorch headers and libraries,
# and PyTorch's Python DTensor as the tests' oracle), and the CMake build in build/. Safe to run again:
# each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${DTENSOR_PYTHON:-python3.11}
TORCH_VERSION=2.14.1

T0=$(date +%s)
log() { echo "[setup] +$(( $(date +%s) - T0 ))s $*"; }  # seconds since setup began: where a fresh clone's time goes

# --- Debian packages: compiler, gtest, gloo's headers (ProcessGroupGloo.hpp includes them), ccache, and the
#     tokenizer's PCRE2 (Unicode regexes), utf8proc (normalization) and libsentencepiece (tokenizer.model); iproute2
#     for the multi-host test's network namespaces; cpp-httplib (serve's HTTP), pkg-config to find it, curl (serve's test);
#     zlib (the checkpoints' CRC-32); CLI11 (the tools' command lines).
need=()
for pkg in g++ libgtest-dev libgloo-dev ccache nlohmann-json3-dev libpcre2-dev libutf8proc-dev libsentencepiece-dev iproute2 \
           libcpp-httplib-dev pkg-config curl zlib1g-dev libcli11-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  log "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}" >/dev/null
fi

# --- venv with torch (a CUDA build from PyPI carries the full C++ include tree; it runs on CPU).
if [ ! -x .venv/bin/python ]; then
  log "creating .venv with $PY"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('$TORCH_VERSION') else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION into .venv (several GB; once)"
  # (pip warns about every find-links location this machine's pip.conf lists; those lines are noise)
  .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check "torch==$TORCH_VERSION" numpy cmake \
    2> >(grep -v '^WARNING: Location' >&2)
fi
# The checkpoint tests' other side: safetensors (PyTorch's DCP Hugging Face storage) and transformers (HF Llama,
# the greedy-generation oracle, tools/bench/generate_bench.py); sentencepiece and protobuf for the tokenizer
# oracle's tokenizer.model (trained by sentencepiece, converted by transformers); jsonschema, the structured output
# oracle's validator.
if ! .venv/bin/python -c "import safetensors, transformers, sentencepiece, google.protobuf, openai, jsonschema" 2>/dev/null; then
  log "installing safetensors, transformers, sentencepiece, protobuf, openai and jsonschema into .venv (once)"
  .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check safetensors transformers sentencepiece protobuf openai jsonschema \
    2> >(grep -v '^WARNING: Location' >&2)
fi
# The float8 and int8 oracles' other side: torchao's Float8Linear, float8 TP styles and Int8WeightOnlyConfig
# (without dependencies: it runs on the torch above, CPU included).
if ! .venv/bin/python -c "import torchao" 2>/dev/null; then
  log "installing torchao into .venv (once)"
  .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check --no-deps "torchao==0.18.0" \
    2> >(grep -v '^WARNING: Location' >&2)
fi
# The LoRA oracle's other side: PEFT (tests/train/lora_peft_test.py), with accelerate, which it imports.
if ! .venv/bin/python -c "import peft" 2>/dev/null; then
  log "installing peft into .venv (once)"
  .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check "peft==0.21.2" \
    2> >(grep -v '^WARNING: Location' >&2)
fi
# The GGUF oracle's other side: ggml's own Python package (writes the files, dequantizes the blocks; transformers'
# from_pretrained(gguf_file=...) reads through it).
if ! .venv/bin/python -c "import gguf" 2>/dev/null; then
  log "installing gguf into .venv (once)"
  .venv/bin/pip install -q --no-cache-dir --disable-pip-version-check "gguf==0.19.0" \
    2> >(grep -v '^WARNING: Location' >&2)
fi
command -v cmake >/dev/null 2>&1 || export PATH="$ROOT/.venv/bin:$PATH"

# --- configure (once; cmake re-runs itself when CMakeLists change).
TORCH_ROOT=$(.venv/bin/python -c "import torch, os; print(os.path.dirname(torch.__file__))")
ABI=$(.venv/bin/python -c "import torch; print(int(torch.compiled_with_cxx11_abi()))")
if [ ! -f build/CMakeCache.txt ]; then
  log "configuring build/ against $TORCH_ROOT"
  cmake -S . -B build -DTORCH_ROOT="$TORCH_ROOT" -DDTENSOR_TORCH_CXX11_ABI="$ABI" \
        -DPython3_EXECUTABLE="$ROOT/.venv/bin/python" >/dev/null
fi

# --- build (2 jobs: the machine has 2 cores and LibTorch translation units are heavy).
log "building"
start=$(date +%s)
cmake --build build -j"${DTENSOR_BUILD_JOBS:-2}" 2>&1 | grep -vE '^\[ *[0-9]+%\] (Building|Linking)|^$' || true
test -x build/bin/dtensor_tests -a -x build/bin/tprun || { echo "[setup] build failed" >&2; exit 1; }
log "build done in $(( $(date +%s) - start ))s"
