#!/usr/bin/env bash
# The layer rule, checked by reading #include lines (docs/design/layout.md). cmake/layers.txt lists each layer of
# src/ (public headers in include/dtensor/<layer>/) and the layers it may include. This fails on:
#   - a file of layer L (src/L/**, include/dtensor/L/**) including a header of a layer not listed for L
#     ("dtensor/<layer>/x.h" public, "<layer>/x.h" internal), or the umbrella "dtensor/dtensor.h";
#   - a folder of src/ or include/dtensor/ that is not in the table;
#   - model code including library headers other than dtensor/core and dtensor/nn: every file of
#     models/<family>/ except the family's plans (parallelize.*, parallelize_*.*), its weight loader (hf_weights.*) and
#     its factory (build.*: plan + weights);
#   - above src/ (the table's `tree` lines): a file of tokenizer/, models/, train/, inference/ or tools/ including a
#     header of a folder not listed for it (the library counts as one folder, "dtensor"), a top-level folder with
#     sources that is not in the table, and an add_library in CMakeLists.txt built from tools/ (tools/ holds mains);
#   - a public header (include/dtensor/**) that the umbrella "dtensor/dtensor.h" does not include.
# The build enforces the same table for src/ (cmake/Layers.cmake); this also covers headers no .cpp includes
# and model code. Usage: scripts/check_layers.sh [ROOT] (default: this checkout). Ends with a `summary` line;
# exit 1 on any violation.
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
TABLE="$ROOT/cmake/layers.txt"
[ -f "$TABLE" ] || { echo "check_layers: no $TABLE" >&2; exit 2; }

declare -A allowed=() tree_allowed=()
while IFS= read -r line; do
  if [[ "$line" =~ ^tree\ ([a-z_]+):(.*)$ ]]; then
    tree_allowed[${BASH_REMATCH[1]}]=" ${BASH_REMATCH[1]} ${BASH_REMATCH[2]} "
    continue
  fi
  [[ "$line" =~ ^([a-z][a-z0-9]*):(.*)$ ]] || continue
  allowed[${BASH_REMATCH[1]}]=" ${BASH_REMATCH[1]} ${BASH_REMATCH[2]} "
done < "$TABLE"

violations=0 files=0 includes=0
report() { echo "check_layers: $*"; violations=$((violations + 1)); }

# "line:path" for each quoted #include of a file.
includes_of() {
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$1" | sed -E 's/^([0-9]+):[^"]*"([^"]+)".*/\1:\2/'
}

# The layer a quoted include names, or "" for a same-folder include.
layer_of() {
  local inc=$1
  if [[ "$inc" == dtensor/*/* ]]; then inc=${inc#dtensor/}; echo "${inc%%/*}"; return; fi
  if [[ "$inc" == */* ]]; then echo "${inc%%/*}"; return; fi
  echo ""
}

for dir in "$ROOT"/src/*/ "$ROOT"/include/dtensor/*/; do
  name=$(basename "$dir")
  [[ -n "${allowed[$name]:-}" ]] || report "${dir#$ROOT/} is not a layer in cmake/layers.txt"
done

for layer in "${!allowed[@]}"; do
  while IFS= read -r file; do
    files=$((files + 1))
    while IFS=: read -r lineno inc; do
      includes=$((includes + 1))
      if [[ "$inc" == "dtensor/dtensor.h" ]]; then
        report "${file#$ROOT/}:$lineno: layer '$layer' includes the umbrella \"$inc\""
        continue
      fi
      target=$(layer_of "$inc")
      [[ -z "$target" || -z "${allowed[$target]:-}" ]] && continue  # same folder, or not ours (gloo/, torch/)
      [[ "${allowed[$layer]}" == *" $target "* ]] ||
        report "${file#$ROOT/}:$lineno: layer '$layer' includes \"$inc\" of layer '$target', which is not below it"
    done < <(includes_of "$file")
  done < <(find "$ROOT/src/$layer" "$ROOT/include/dtensor/$layer" \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null)
done

for family in "$ROOT"/models/*/; do
  [[ "$(basename "$family")" == common || "$(basename "$family")" == moved ]] && continue
  while IFS= read -r file; do
    case "$(basename "$file")" in parallelize.* | parallelize_*.* | hf_weights.* | gguf_weights.* | build.*) continue ;; esac
    files=$((files + 1))
    while IFS=: read -r lineno inc; do
      includes=$((includes + 1))
      [[ "$inc" == dtensor/* ]] || continue
      [[ "$inc" == dtensor/core/* || "$inc" == dtensor/nn/* ]] ||
        report "${file#$ROOT/}:$lineno: model code includes \"$inc\" (model code depends on dtensor/nn and dtensor/core alone; plans go in parallelize.*)"
    done < <(includes_of "$file")
  done < <(find "$family" \( -name '*.h' -o -name '*.cpp' \))
done

# Above src/. The folder an include of a file in `dir` names, in REPLY (no subshell: this runs per include):
# "dtensor" for the library's headers, else the top-level folder the header resolves to (beside the file, from the
# repository root, or from models/), "" when it is not ours.
folder_of() {
  local dir=$1 inc=$2 base path
  REPLY=""
  if [[ "$inc" == dtensor/* ]]; then REPLY=dtensor; return; fi
  for base in "$dir" "$ROOT" "$ROOT/models"; do
    [[ -e "$base/$inc" ]] || continue
    path="$base/$inc"
    while [[ "$path" == */../* ]]; do path=$(sed -E 's#/[^/]+/\.\./#/#' <<<"$path"); done
    path=${path//\/.\//\/}
    [[ "$path" == "$ROOT"/* ]] || return
    path=${path#$ROOT/}
    REPLY=${path%%/*}
    return
  done
}
for dir in "$ROOT"/*/; do
  name=$(basename "$dir")
  case "$name" in src | include | tests | examples | docs | scripts | cmake | build* | shared) continue ;; esac
  if [[ -z "${tree_allowed[$name]:-}" ]] && [[ -n "$(find "$dir" \( -name '*.h' -o -name '*.cpp' \) -print -quit)" ]]; then
    report "$name/ holds sources but is not in cmake/layers.txt's tree"
  fi
done
tree_folders=0
for folder in "${!tree_allowed[@]}"; do
  [[ -d "$ROOT/$folder" ]] || continue
  tree_folders=$((tree_folders + 1))
  while IFS= read -r file; do
    files=$((files + 1))
    while IFS=: read -r lineno inc; do
      includes=$((includes + 1))
      folder_of "${file%/*}" "$inc"
      target=$REPLY
      [[ -z "$target" ]] && continue
      [[ "$target" == src ]] && target=dtensor
      [[ "${tree_allowed[$folder]}" == *" $target "* ]] ||
        report "${file#$ROOT/}:$lineno: '$folder' includes \"$inc\" of '$target', which is not below it"
    done < <(includes_of "$file")
  done < <(find "$ROOT/$folder" \( -name '*.h' -o -name '*.cpp' \))
done
# tools/ holds mains: no library target takes a source from it.
if [[ -f "$ROOT/CMakeLists.txt" ]]; then
  while IFS= read -r hit; do
    report "CMakeLists.txt: $hit (a library from tools/: libraries live in their layer; tools/ holds mains)"
  done < <(awk '/add_library\(/ { lib = 1; text = "" } lib { text = text $0 } lib && /\)/ { if (text ~ /tools\//) { sub(/^[ \t]+/, "", text); print substr(text, 1, 80) } lib = 0 }' "$ROOT/CMakeLists.txt")
fi
# The umbrella "dtensor/dtensor.h" includes every public header (a user's one include reaches all of the API).
if [[ -f "$ROOT/include/dtensor/dtensor.h" ]]; then
  while IFS= read -r header; do
    header=${header#$ROOT/include/}
    [[ "$header" == dtensor/dtensor.h ]] && continue
    grep -qF "#include \"$header\"" "$ROOT/include/dtensor/dtensor.h" ||
      report "include/dtensor/dtensor.h: misses the public header \"$header\""
  done < <(find "$ROOT/include/dtensor" -name '*.h' | sort)
fi

echo "summary layers=${#allowed[@]} tree_folders=$tree_folders files=$files includes=$includes violations=$violations"
[ "$violations" -eq 0 ]
