#!/usr/bin/env bash
# The second pass of Orbax's guides (issue 35): tests/python/test_orbax_guides.py
# on Python 3.12 with the newest jax, flax, orbax-checkpoint and grain that pip
# finds (no pins), against this checkout's package built for that Python.
# Prints the versions it ran with. scripts/test.sh runs it after the main suite.
#
#   PY312=/path/to/python3.12 bash scripts/orbax_guides_latest.sh [pytest args]
#
# Cost: the package is built for 3.12 as scripts/setup.sh builds it for the
# suite (pip, scikit-build-core, Release, Ninja) and through ccache with the
# same CCACHE_BASEDIR / CCACHE_NOHASHDIR, in build-py312/ (as deep as setup.sh's
# build-py/, so every path ccache hashes is the same): the core library and
# the tool are cache hits of setup.sh's compile, and only the objects that
# include Python's headers (the nanobind module and nanobind itself) are
# compiled for 3.12, once per machine. Measured on the shared 2-core machine
# (2026-11-29; `time bash scripts/orbax_guides_latest.sh`, after setup.sh's
# build-py compile; pip's downloads from its cache): 138 s with a cold cache
# for the 3.12 objects (pip 39 s, build 76 s: 34 compiles, tests 23 s); 101 s
# warm, in a fresh checkout on a machine that ran it before (pip 64 s for the
# new venv, build 13 s, tests 24 s). It was about 22 minutes per fresh
# checkout before, compiling everything without ccache. Last result: 16
# passed with Python 3.12.1, jax 0.12.0.1, flax 0.12.12, orbax-checkpoint
# 0.12.8, grain 0.2.18, numpy 2.5.5.
#
# Python 3.12: $PY312, else the newest pyenv 3.12.x ($PYENV_ROOT or ~/.pyenv),
# else `python3.12` on PATH (each checked to run and to have Python.h). None:
# on Debian/Ubuntu releases that package it (Ubuntu 24.04; not Debian 12) it
# is installed with apt-get (python3.12-dev python3.12-venv); otherwise the
# pass is SKIPPED with a loud message and exit 0 (Debian 12 has no 3.12
# package, and python.org, where pyenv builds one from, is not reachable from
# CI: there, `pyenv install 3.12` on a machine that reaches it, or PY312=).
# A PY312= that is not a Python 3.12 with its headers fails (exit 1).
#
# The venv (build-py312-venv/) and the build directory are kept, so that a
# second run compiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

is_py312() {  # a Python 3.12 that runs and can build extensions
  [ -n "$1" ] && "$1" -c 'import os, sys, sysconfig
assert sys.version_info[:2] == (3, 12)
assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' >/dev/null 2>&1
}
find_py312() {
  local c
  if [ -n "${PY312:-}" ]; then
    if ! is_py312 "$PY312"; then
      echo "orbax_guides_latest: PY312=$PY312 is not a Python 3.12 with its headers (Python.h)" >&2
      return 1
    fi
    echo "$PY312"
    return 0
  fi
  for c in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12 2>/dev/null | sort -V -r) \
           "$(command -v python3.12 || true)" /usr/bin/python3.12 /usr/local/bin/python3.12; do
    if is_py312 "$c"; then echo "$c"; return 0; fi
  done
}
if [ -n "${PY312:-}" ]; then
  PY=$(find_py312)  # one given that is not 3.12: an error, not a skip
else
  PY=$(find_py312 || true)
fi
if [ -z "$PY" ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  if [ -n "$(apt-cache policy python3.12-dev 2>/dev/null | awk '/Candidate:/ && $2 != "(none)"')" ]; then
    echo "orbax_guides_latest: installing Python 3.12 from the distribution (python3.12-dev python3.12-venv)"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3.12-dev python3.12-venv >/dev/null
    PY=$(find_py312 || true)
  fi
fi
if [ -z "$PY" ]; then
  {
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!! orbax_guides_latest: SKIPPED: no Python 3.12 here (pyenv's,"
    echo "!!! python3.12 on PATH, or the distribution's python3.12-dev). The guides ran on the"
    echo "!!! suite's Python only. Give one with PY312=/path/to/python3.12 (see this script's header)."
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  } >&2
  exit 0
fi

start=$SECONDS
build=build-py312
venv=build-py312-venv
[ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
# The build tools as pinned for the suite; the frameworks the guides use, newest.
"$venv/bin/python" -m pip install -q $(grep -E '^(scikit-build-core|nanobind|pytest)==' python/requirements-test.txt)
"$venv/bin/python" -m pip install -q --upgrade jax flax orbax-checkpoint grain etils numpy ml_dtypes
installed=$SECONDS
# Compiled as scripts/setup.sh compiles (ccache keyed relative to the checkout).
export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
"$venv/bin/python" -m pip install -q --no-build-isolation -C build-dir="$build" .
built=$SECONDS
"$venv/bin/python" - <<'PY'
import sys, importlib.metadata as md
print("orbax_guides_latest: Python", sys.version.split()[0],
      *(f"{p}=={md.version(p)}" for p in ("jax", "flax", "orbax-checkpoint", "grain", "numpy")))
PY
# Run from tests/python so that `import treecask` is the venv's install, not python/treecask.
(cd tests/python && "../../$venv/bin/python" -m pytest test_orbax_guides.py -q -p no:cacheprovider "$@")
echo "orbax_guides_latest: $((SECONDS - start)) s in all: pip $((installed - start)) s," \
     "build $((built - installed)) s, tests $((SECONDS - built)) s"
