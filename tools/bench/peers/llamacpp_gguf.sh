#!/usr/bin/env bash
# An HF Llama checkpoint (config.json + *.safetensors) as GGUF for the llama.cpp peer: OUT_DIR/model-bf16.gguf via the
# vendored convert_hf_to_gguf.py, then model-q8_0.gguf and model-q4_0.gguf via llama-quantize. Idempotent.
#   tools/bench/peers/llamacpp_gguf.sh HF_DIR OUT_DIR
# Benchmark checkpoints carry random weights and no tokenizer, and the converter has no flag for that (only
# --vocab-only): it always builds a vocab from tokenizer files. So it runs under a shim that writes the "none"
# tokenizer model (llama.cpp then adds <arch>.vocab_size dummy tokens, enough for llama-bench's random token ids),
# and names the architecture from model_type when config.json lacks "architectures" (transformers keeps it unset).
set -euo pipefail
[[ $# == 2 ]] || { echo "usage: $0 HF_DIR OUT_DIR" >&2; exit 2; }
hf=$(realpath "$1") out=$2
bin=$("$(dirname "$0")/llamacpp_setup.sh")
src=$(realpath "$bin/../../llama.cpp")
py=$(realpath "$(dirname "$0")/../../..")/.venv/bin/python
mkdir -p "$out"
if [[ ! -s $out/model-bf16.gguf ]]; then
  echo "[llamacpp_gguf] converting $hf -> $out/model-bf16.gguf" >&2
  PYTHONPATH="$src:$src/gguf-py" nice -n 19 "$py" - "$hf" --outtype bf16 --outfile "$out/model-bf16.gguf.part" \
    >&2 <<EOF
import runpy, sys
from conversion import base, llama
load = base.ModelBase.load_hparams
def load_hparams(dir_model, is_mistral_format):
    hp = load(dir_model, is_mistral_format)
    if not hp.get("architectures") and hp.get("model_type") == "llama":
        hp["architectures"] = ["LlamaForCausalLM"]
    return hp
base.ModelBase.load_hparams = staticmethod(load_hparams)
llama.LlamaModel.set_vocab = lambda self: self._set_vocab_none()
sys.argv[0] = "$src/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
EOF
  mv "$out/model-bf16.gguf.part" "$out/model-bf16.gguf"
fi
for q in q8_0 q4_0; do
  if [[ ! -s $out/model-$q.gguf ]]; then
    echo "[llamacpp_gguf] quantizing -> $out/model-$q.gguf" >&2
    nice -n 19 "$bin/llama-quantize" "$out/model-bf16.gguf" "$out/model-$q.gguf.part" "${q^^}" >&2
    mv "$out/model-$q.gguf.part" "$out/model-$q.gguf"
  fi
done
ls -l "$out"/model-{bf16,q8_0,q4_0}.gguf >&2
