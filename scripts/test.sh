#!/usr/bin/env bash
# The test command (README "Run the tests"): sets up a fresh machine, builds,
# then runs every C++ test under ctest and the Python suite under pytest, from
# the source install and again from the manylinux wheel in a fresh venv.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2
export TREECASK_CLI="$PWD/$BUILD_DIR/src/cli/treecask"
.venv/bin/python -m pytest tests/python -q
# Orbax's guides again on Python 3.12 with the newest jax/flax/orbax/grain (issue 35).
bash scripts/orbax_guides_latest.sh
# The same suite against the manylinux wheel in a fresh virtual environment
# (scripts/wheel_test.sh: auditwheel-bundled LMDB, LZ4, xxHash; pip alone).
bash scripts/wheel_test.sh
