#!/usr/bin/env bash
# Installs everything treecask needs on a fresh Debian 12 machine, then builds
# the C++ library, CLI and tests into build/ and the Python package into .venv/.
# Idempotent: re-running only rebuilds what changed.
#
# Environment: BUILD_DIR (default build), SKIP_PYTHON=1 to skip the venv.
# The Python package (extension and `treecask` tool) is built in build-py/,
# kept between runs: a re-run, and scripts/wheel.sh after it, only rebuild
# what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  liblmdb-dev libflatbuffers-dev flatbuffers-compiler libxxhash-dev liblz4-dev
  doctest-dev libcli11-dev nlohmann-json3-dev libzip-dev
  python3-venv unzip
  libcurl4-openssl-dev nginx-light libssl-dev
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"

if [ "${SKIP_PYTHON:-0}" != 1 ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r python/requirements-test.txt
  .venv/bin/python -m pip install -q --no-build-isolation -C build-dir=build-py .
fi
echo "setup: done (C++ build in $BUILD_DIR, Python in .venv)"
