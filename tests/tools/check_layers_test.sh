#!/usr/bin/env bash
# scripts/check_layers.sh passes on this tree and fails, naming the file, on each kind of violation planted in a
# copy of it: an upward public include in a .cpp, an upward internal include in a header no .cpp includes,
# model code including a plan-level header, a folder that is not a layer; above src/: train including a tool's
# header, model code including the inference layer, a relative upward include, a top-level folder outside the
# table, and a library built from tools/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CHECK="$ROOT/scripts/check_layers.sh"
"$CHECK" "$ROOT" >/dev/null || { echo "FAIL: the tree itself violates the layer rule"; "$CHECK" "$ROOT"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
expect_violation() {  # name, file (relative), line to append, expected text
  rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cp -r "$ROOT/cmake" "$ROOT/src" "$ROOT/include" "$ROOT/models" \
    "$ROOT/tokenizer" "$ROOT/train" "$ROOT/inference" "$ROOT/tools" "$ROOT/CMakeLists.txt" "$tmp/tree/"
  mkdir -p "$(dirname "$tmp/tree/$2")" && echo "$3" >> "$tmp/tree/$2"
  if out=$("$CHECK" "$tmp/tree" 2>&1); then echo "FAIL ($1): check_layers passed"; exit 1; fi
  grep -qF "$4" <<<"$out" || { echo "FAIL ($1): no '$4' in:"; echo "$out"; exit 1; }
  echo "ok ($1): $(grep -F "$4" <<<"$out" | head -1)"
}
expect_violation "mesh includes tp" src/mesh/world.cpp '#include "dtensor/tp/style.h"' "src/mesh/world.cpp"
expect_violation "tensor header includes ops internals" include/dtensor/tensor/placement.h '#include "ops/op_call.h"' \
  "include/dtensor/tensor/placement.h"
expect_violation "nn includes the umbrella" src/nn/layers.cpp '#include "dtensor/dtensor.h"' "umbrella"
expect_violation "model code includes a style" models/llama/model.cpp '#include "dtensor/tp/style.h"' "model code includes"
expect_violation "a folder outside the table" src/extras/x.cpp '// nothing' "src/extras/ is not a layer"
expect_violation "train includes a tool's header" train/options.h '#include "tools/common/cli.h"' \
  "train/options.h:"
expect_violation "model code includes inference" models/llama/model.cpp '#include "inference/generate.h"' \
  "'models' includes \"inference/generate.h\""
expect_violation "a relative upward include" tokenizer/text.cpp '#include "../tools/common/cli.h"' "tokenizer/text.cpp:"
expect_violation "a top-level folder outside the table" extras/x.cpp '// nothing' "extras/ holds sources"
expect_violation "a library from tools/" CMakeLists.txt 'add_library(x STATIC tools/serve/x.cpp)' "a library from tools/"
expect_violation "a public header the umbrella misses" include/dtensor/core/new_api.h "#pragma once" \
  "misses the public header \"dtensor/core/new_api.h\""
echo "check_layers_test: all passed"
