#!/usr/bin/env bash
# Every gtest of a binary runs in exactly one ctest entry: the layer entries' filters (tests/CMakeLists.txt,
# dtensor_layer_tests, written to build/test_layers.txt as "binary<TAB>entry<TAB>filter") together select each test
# of the binary once. A suite the configure step did not see (defined through a macro, say) would otherwise never
# run. Usage: check_test_layers.sh BUILD_DIR. Ends with a `summary` line; exit 1 on a test run by no entry or twice.
set -euo pipefail
BUILD=$1
TABLE="$BUILD/test_layers.txt"
[ -f "$TABLE" ] || { echo "check_test_layers: no $TABLE" >&2; exit 2; }
# "Suite.Test" names of a binary under a filter.
tests_of() {
  "$BUILD/bin/$1" --gtest_list_tests --gtest_filter="$2" | awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }'
}
bad=0 total=0
for binary in $(cut -f1 "$TABLE" | sort -u); do
  all=$(tests_of "$binary" '*' | sort)
  covered=$(while IFS=$'\t' read -r b entry filter; do
              if [ "$b" = "$binary" ]; then tests_of "$binary" "$filter"; fi
            done < "$TABLE" | sort)
  missing=$(comm -23 <(echo "$all") <(echo "$covered" | sort -u))
  twice=$(echo "$covered" | uniq -d)
  n=$(echo "$all" | grep -c . || true)
  total=$((total + n))
  [ -z "$missing" ] || { echo "check_test_layers: $binary: in no layer entry:"; echo "$missing" | head -20; bad=1; }
  [ -z "$twice" ] || { echo "check_test_layers: $binary: in two entries:"; echo "$twice" | head -20; bad=1; }
done
echo "summary binaries=$(cut -f1 "$TABLE" | sort -u | wc -l) entries=$(wc -l < "$TABLE") tests=$total ok=$((1 - bad))"
exit $bad
