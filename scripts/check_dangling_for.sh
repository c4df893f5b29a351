#!/usr/bin/env bash
# A range-for over a member of a temporary: `for (x : File::open(path).tensors())` destroys the File before the loop
# body runs (C++20 extends the life of the range, a reference into the temporary, not of the temporary), so the loop
# reads freed memory: usually the old values, sometimes a SIGSEGV (llama_generate --gguf's, found by valgrind). GCC
# 12 has no -Wdangling-reference; this reads the sources for the shape `: Name::factory(...).member()` in a range-for.
# Usage: scripts/check_dangling_for.sh [ROOT]. Ends with a `summary` line; exit 1 on any hit.
set -euo pipefail
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT"
pattern='for \([^;]*[^:]: [A-Za-z_][A-Za-z0-9_:]*::[a-z_]+\([^()]*(\([^()]*\)[^()]*)*\)\.[A-Za-z_]+\(\)\)'
hits=$(grep -rnE "$pattern" --include='*.cpp' --include='*.h' src include models inference tokenizer train tools tests || true)
files=$(find src include models inference tokenizer train tools tests -name '*.cpp' -o -name '*.h' | wc -l)
if [ -n "$hits" ]; then
  echo "$hits" | sed 's/^/check_dangling_for: a range-for over a member of a temporary (keep the object in a local): /'
fi
count=$(printf '%s' "$hits" | grep -c . || true)
echo "summary files=$files dangling_range_for=$count"
[ "$count" -eq 0 ]
