#!/usr/bin/env bash
# Installs everything treecask needs on a fresh Debian 12 machine, then builds
# the C++ library, CLI and tests into build/ and the Python package into .venv/.
# Idempotent: re-running only rebuilds what changed.
#
# Environment: BUILD_DIR (default build), SKIP_PYTHON=1 to skip the venv,
# SETUP_FOR=tool for the main job (scripts/main_job.sh): only the Debian
# packages the library and the `treecask` tool need (and pip, with which the
# main job fetches its model), and only the tool built (its target and what it
# links); no tests, benchmarks, nginx or venv. The test command
# (scripts/test.sh) runs the whole set-up, which installs the rest.
# The Python package (extension and `treecask` tool) is built in build-py/,
# kept between runs: a re-run, and scripts/wheel.sh after it, only rebuild
# what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

SETUP_FOR=${SETUP_FOR:-all}
# The library and the tool (scripts/main_job.sh uses nothing else).
APT_TOOL=(
  build-essential cmake ninja-build pkg-config
  liblmdb-dev libflatbuffers-dev flatbuffers-compiler libxxhash-dev liblz4-dev
  libcli11-dev nlohmann-json3-dev libzip-dev libcurl4-openssl-dev libssl-dev
  python3-pip ccache
)
# The tests: doctest, the venv they run in, nginx they serve objects with.
APT_TEST=(
  doctest-dev python3-venv unzip nginx-light
)
case "$SETUP_FOR" in
  tool) APT_PACKAGES=("${APT_TOOL[@]}"); SKIP_PYTHON=1 ;;
  all) APT_PACKAGES=("${APT_TOOL[@]}" "${APT_TEST[@]}") ;;
  *) echo "setup: SETUP_FOR must be tool or all, not $SETUP_FOR" >&2; exit 2 ;;
esac
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
# Every compile (this tree's, the Python package's build-py/, the wheel's) goes
# through ccache: a re-run, another checkout of the same sources or CI's fresh
# clone on a machine that built them before compiles only what changed. Paths
# are hashed relative to the checkout, so two checkouts share the cache.
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
CACHE="$BUILD_DIR/CMakeCache.txt"
if [ "$SETUP_FOR" = tool ]; then
  # A fresh build tree without the tests (doctest is not installed); an
  # existing one is kept as it is. Only the tool's target is built.
  if [ ! -f "$CACHE" ]; then
    cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTREECASK_BUILD_TESTS=OFF -DTREECASK_BUILD_BENCH=OFF
  fi
  cmake --build "$BUILD_DIR" --target treecask_cli -j "$(nproc)"
else
  # Tests and benchmarks on, also in a tree the main job configured without them.
  if [ ! -f "$CACHE" ] || grep -q '^TREECASK_BUILD_\(TESTS\|BENCH\):BOOL=OFF' "$CACHE"; then
    cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DTREECASK_BUILD_TESTS=ON -DTREECASK_BUILD_BENCH=ON
  fi
  cmake --build "$BUILD_DIR" -j "$(nproc)"
fi

if [ "${SKIP_PYTHON:-0}" != 1 ]; then
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -r python/requirements-test.txt
  .venv/bin/python -m pip install -q --no-build-isolation -C build-dir=build-py .
fi
if [ "$SETUP_FOR" = tool ]; then
  echo "setup: done (the treecask tool in $BUILD_DIR/src/cli)"
else
  echo "setup: done (C++ build in $BUILD_DIR, Python in .venv)"
fi
