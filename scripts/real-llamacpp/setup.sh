#!/usr/bin/env bash
# Installs a real llama.cpp server (`llama-server`) for the opt-in end-to-end check
# (scripts/e2e-real-llamacpp.sh), idempotently, from registry packages only:
# - a venv with cmake, ninja (their PyPI wheels ship the binaries), gguf and numpy;
# - the llama.cpp source that PyPI's llama-cpp-python sdist vendors (pinned below; its
#   CHANGELOG names the llama.cpp commit), built into `llama-server` (CPU, no UI, no TLS);
# - a tiny random-weight GGUF model written by make_tiny_gguf.py.
# Nothing is downloaded from anywhere else. Takes ~10 min on 2 cores the first time (the
# build), seconds after. Prints the install directory.
#
# Environment: LLAMACPP_DIR (default /opt/llamacpp), LLAMACPP_JOBS (default: nproc).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${LLAMACPP_DIR:-/opt/llamacpp}"
# llama-cpp-python 0.3.36 vendors llama.cpp at ggml-org/llama.cpp@0c1e57098.
PKG_VERSION=0.3.36
JOBS="${LLAMACPP_JOBS:-$(nproc)}"
mkdir -p "$DIR"
log() { echo "[real-llamacpp] $*" >&2; }

if [[ ! -x "$DIR/venv/bin/python" ]]; then
  log "venv"
  python3 -m venv "$DIR/venv"
fi
if ! "$DIR/venv/bin/python" -c "import gguf, numpy" 2>/dev/null || [[ ! -x "$DIR/venv/bin/cmake" ]]; then
  log "cmake, ninja, gguf, numpy"
  "$DIR/venv/bin/pip" install -q cmake ninja "gguf==0.19.0" numpy
fi

if [[ ! -x "$DIR/bin/llama-server" ]]; then
  SRC="$DIR/src/llama_cpp_python-$PKG_VERSION"
  if [[ ! -d "$SRC/vendor/llama.cpp" ]]; then
    log "llama-cpp-python $PKG_VERSION sdist"
    mkdir -p "$DIR/src"
    "$DIR/venv/bin/pip" download -q --no-deps --no-binary llama-cpp-python \
      "llama-cpp-python==$PKG_VERSION" -d "$DIR/src"
    tar -xzf "$DIR/src/llama_cpp_python-$PKG_VERSION.tar.gz" -C "$DIR/src"
  fi
  log "building llama-server ($JOBS jobs)"
  PATH="$DIR/venv/bin:$PATH" cmake -S "$SRC/vendor/llama.cpp" -B "$DIR/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$DIR/cmake.log" 2>&1 \
    || { tail -30 "$DIR/cmake.log" >&2; exit 1; }
  PATH="$DIR/venv/bin:$PATH" cmake --build "$DIR/build" --target llama-server -j "$JOBS" \
    >"$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log" >&2; exit 1; }
  mkdir -p "$DIR/bin"
  cp "$DIR/build/bin/llama-server" "$DIR/bin/llama-server"
fi

if [[ ! -f "$DIR/tiny.gguf" ]]; then
  log "tiny model"
  "$DIR/venv/bin/python" "$HERE/make_tiny_gguf.py" "$DIR/tiny.gguf"
fi
echo "$DIR"
