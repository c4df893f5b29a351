# Sourced by tools/gpu/build.sh and cuda_check.sh. Where the work tree holds .devdeps/ (tools/gpu/devdeps.sh, carried
# to a GPU machine that lacks the Debian packages), puts what it carries in reach:
#   DEVDEPS           its absolute path (unset without .devdeps: then this file does nothing)
#   LD_LIBRARY_PATH   .devdeps/lib, and DEVDEPS_RT: links to those of .devdeps/fallback/ (libssl, libcrypto, brotli,
#                     libz: what libcpp-httplib needs) whose sonames this machine cannot load itself
#   GTEST_SRC         .devdeps/googletest, unless set or /usr/src/googletest exists
#   /usr/share/common-licenses   copied from .devdeps where missing (llama_train's default data, the tokenizer oracle)
# build.sh adds the CMake side (tools/gpu/build.sh: CMAKE_PREFIX_PATH, -isystem, gloo, zlib, cpp-httplib).
_dd_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [ -d "$_dd_root/.devdeps" ]; then
  export DEVDEPS=$_dd_root/.devdeps
  export DEVDEPS_RT=${DEVDEPS_RT:-/tmp/devdeps_rt}
  mkdir -p "$DEVDEPS_RT"
  for _dd_so in $(python3 - "$DEVDEPS"/fallback/* <<'EOF'
import ctypes, os, sys
for path in sys.argv[1:]:
    try:
        ctypes.CDLL(os.path.basename(path))
    except OSError:
        print(path)
EOF
  ); do
    ln -sf "$_dd_so" "$DEVDEPS_RT/"
  done
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$DEVDEPS/lib:"*) ;;
    *) export LD_LIBRARY_PATH=$DEVDEPS/lib:$DEVDEPS_RT${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;;
  esac
  if [ -z "${GTEST_SRC:-}" ] && [ ! -d /usr/src/googletest ]; then export GTEST_SRC=$DEVDEPS/googletest; fi
  if [ ! -e /usr/share/common-licenses/GPL-3 ] && mkdir -p /usr/share/common-licenses 2>/dev/null; then
    cp -an "$DEVDEPS"/common-licenses/. /usr/share/common-licenses/ 2>/dev/null || true
  fi
  echo "devdeps: $DEVDEPS; loaded from fallback/: $(ls "$DEVDEPS_RT" | tr '\n' ' ')"
fi
unset _dd_root _dd_so
