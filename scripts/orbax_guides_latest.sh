#!/usr/bin/env bash
# The second pass of Orbax's guides (issue 35): tests/python/test_orbax_guides.py
# on Python 3.12 with the newest jax, flax, orbax-checkpoint and grain that pip
# finds (no pins), against this checkout's package built for that Python.
# Prints the versions it ran with. Not run by scripts/test.sh: its first run
# builds the package again for Python 3.12 (measured 2026-11-29 on the shared
# 2-core machine: about 22 minutes, nearly all compiling; the tests 45 s);
# a second run reuses build-py312/ and took 46 s in all. Last result: 14
# passed with Python 3.12.1, jax 0.12.0.1, flax 0.12.12, orbax-checkpoint
# 0.12.8, grain 0.2.18, numpy 2.5.5.
#
#   PY312=/path/to/python3.12 bash scripts/orbax_guides_latest.sh [pytest args]
#
# Needs the build set-up of scripts/setup.sh (the Debian -dev packages).
# The venv and the build directory are kept (build-py312/) so that a second
# run compiles only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python}
work=${ORBAX_LATEST_DIR:-build-py312}
venv="$work/venv"
mkdir -p "$work"
[ -x "$venv/bin/python" ] || "$PY312" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
# The build tools and NumPy as pinned for the suite; the frameworks the guides use, newest.
grep -E '^(scikit-build-core|nanobind|pytest)==' python/requirements-test.txt > "$work/req.txt"
"$venv/bin/python" -m pip install -q -r "$work/req.txt"
"$venv/bin/python" -m pip install -q --upgrade jax flax orbax-checkpoint grain etils numpy ml_dtypes
"$venv/bin/python" -m pip install -q --no-build-isolation -C build-dir="$work/build" .
"$venv/bin/python" - <<'PY'
import sys, importlib.metadata as md
print("orbax_guides_latest: Python", sys.version.split()[0],
      *(f"{p}=={md.version(p)}" for p in ("jax", "flax", "orbax-checkpoint", "grain", "numpy")))
PY
# Run from tests/python so that `import treecask` is the venv's install, not python/treecask.
cd tests/python
"../../$venv/bin/python" -m pytest test_orbax_guides.py -q -p no:cacheprovider "$@"
