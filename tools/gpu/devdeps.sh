#!/bin/bash
# (Re)creates .devdeps/: what a lent GPU machine lacks to build and test dtensor-cpp, taken from this Debian 12
# machine, so that a device run can carry it (run's carry: [".devdeps"]; /.devdeps/ is in .git/info/exclude).
# The GPU image (Ubuntu-like, python3 3.12 with torch, transformers, tokenizers, nvcc, cmake, ninja) has none of:
#   include/            pcre2.h utf8proc.h sentencepiece_processor.h nlohmann/ CLI/ (-isystem and CMAKE_PREFIX_PATH)
#   lib/                libpcre2-8, libutf8proc, libsentencepiece, libcpp-httplib: linker name -> soname -> file
#   httplib/include/    Debian's httplib.h (declarations of the compiled libcpp-httplib) and what it includes with
#                       Debian's definitions (openssl/, brotli/): CMakeLists' DTENSOR_HTTPLIB_INCLUDE, no pkg-config
#   zlib/include/       zlib.h zconf.h, used only where the machine has no zlib.h (checkpoints' crc32_z, httplib)
#   fallback/           runtime libraries libcpp-httplib needs (libssl, libcrypto, brotli, libz): linked in only for
#                       the sonames the machine cannot load (tools/gpu/devdeps_env.sh)
#   gloo/               gloo's headers (the torch wheels ship none): DTENSOR_GLOO_INCLUDE when the machine has none
#   googletest/         googletest's sources (build.sh builds and installs them under /tmp/gtinst)
#   common-licenses/    /usr/share/common-licenses (llama_train's default data, the tokenizer oracle's corpus),
#                       copied there only where the machine lacks it
#   whl/                the `openai` client and what it needs beyond the image, as cp312 manylinux / py3 wheels
#                       (tests/inference/serve_*_test.py), the versions of this project's .venv
# Idempotent: everything but the wheels is rebuilt from the system each time; a wheel already there is kept.
# Needs the Debian packages of scripts/setup.sh plus libssl-dev libbrotli-dev googletest (installed if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=.devdeps
ML=/usr/lib/x86_64-linux-gnu
log() { echo "[devdeps] $*"; }

need=()
for pkg in libpcre2-dev libutf8proc-dev libsentencepiece-dev nlohmann-json3-dev libcli11-dev libcpp-httplib-dev \
           libssl-dev libbrotli-dev zlib1g-dev libgloo-dev googletest; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  log "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}" >/dev/null
fi
grep -qxF "/.devdeps/" .git/info/exclude 2>/dev/null || echo "/.devdeps/" >> .git/info/exclude

rm -rf "$D/include" "$D/lib" "$D/httplib" "$D/zlib" "$D/fallback" "$D/gloo" "$D/googletest" "$D/common-licenses"
mkdir -p "$D/include" "$D/lib" "$D/httplib/include" "$D/zlib/include" "$D/fallback" "$D/gloo" "$D/whl"

# Headers used through the ordinary include path.
cp -a /usr/include/pcre2.h /usr/include/utf8proc.h /usr/include/sentencepiece_processor.h "$D/include/"
cp -a /usr/include/nlohmann /usr/include/CLI "$D/include/"

# Shared libraries: the real file, the soname and the linker name (relative links, inside .devdeps).
copy_lib() {  # copy_lib LINKER_NAME (libX.so)
  local real soname
  real=$(readlink -f "$ML/$1")
  soname=$(objdump -p "$real" | awk '/SONAME/{print $2}')
  cp "$real" "$D/lib/"
  [ "$soname" = "$(basename "$real")" ] || ln -sf "$(basename "$real")" "$D/lib/$soname"
  ln -sf "$soname" "$D/lib/$1"
}
for l in libpcre2-8.so libutf8proc.so libsentencepiece.so libcpp-httplib.so; do copy_lib "$l"; done

# cpp-httplib: Debian's is a compiled library built with OpenSSL, zlib and brotli support; its header declares
# members under those definitions, so a user compiles with them (and their headers) too.
cp -a /usr/include/httplib.h "$D/httplib/include/"
cp -a /usr/include/openssl /usr/include/brotli "$D/httplib/include/"
cp -a /usr/include/x86_64-linux-gnu/openssl/. "$D/httplib/include/openssl/"  # configuration.h, opensslconf.h
cp -a /usr/include/zlib.h /usr/include/zconf.h "$D/zlib/include/"
for so in libssl.so.3 libcrypto.so.3 libbrotlicommon.so.1 libbrotlidec.so.1 libbrotlienc.so.1 libz.so.1; do
  cp "$(readlink -f "$ML/$so")" "$D/fallback/$so"
done
# Every soname the carried libraries need is on a stock image (libc, libm, libstdc++, libgcc_s) or in fallback/.
for f in "$D"/lib/*.so.* "$D"/fallback/*; do
  [ -L "$f" ] && continue
  for n in $(objdump -p "$f" | awk '/NEEDED/{print $2}'); do
    case $n in libc.so.6|libm.so.6|libstdc++.so.6|libgcc_s.so.1|ld-linux-x86-64.so.2) ;;
      *) [ -e "$D/fallback/$n" ] || [ -e "$D/lib/$n" ] || { log "error: $f needs $n, not carried"; exit 1; } ;;
    esac
  done
done

cp -a /usr/include/gloo "$D/gloo/"
cp -a /usr/src/googletest "$D/googletest"
cp -a /usr/share/common-licenses "$D/common-licenses"

# The openai client (tests/inference/serve_*_test.py) and its requirements that the GPU image lacks or may hold in too
# old a version, pinned to what .venv holds (the versions the serve tests pass with here). One version of each.
WHEELS="openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 h11==0.16.0 anyio==4.16.0 idna==3.20
        sniffio==1.3.1 pydantic==2.14.4 pydantic_core==2.50.5 jiter==0.19.0 typing_extensions==4.16.0
        typing_inspection==0.4.5 annotated_types==0.8.0"
PIP=${PIP:-.venv/bin/python -m pip}
for spec in $WHEELS; do
  name=${spec%%==*}; ver=${spec#*==}
  ls "$D/whl/${name}-${ver}-"*.whl >/dev/null 2>&1 && continue
  rm -f "$D/whl/${name}-"*.whl  # another version: one of each
  log "downloading $spec"
  { $PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$D/whl" "$spec"; } 2>&1 | { grep -v "is ignored: it is neither" || true; }
done
n=$(ls "$D"/whl/*.whl | wc -l)
[ "$n" = "$(echo $WHEELS | wc -w)" ] || { log "error: $n wheels in $D/whl, expected $(echo $WHEELS | wc -w)"; exit 1; }
log "done: $(du -sh "$D" | cut -f1) in $D ($n wheels)"
