#!/usr/bin/env bash
# The wheel test (run by scripts/test.sh): builds the manylinux wheel
# (scripts/wheel.sh), installs it into a fresh virtual environment holding only
# PyPI packages, and runs the Python test suite against that install. Fails if
# `import treecask` resolves anywhere but the fresh environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/wheel.sh
venv=$(mktemp -d)/venv
trap 'rm -rf "$(dirname "$venv")"' EXIT
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
# The test requirements without the build tools: the wheel needs no compiler.
grep -v -E '^(scikit-build-core|nanobind)==' python/requirements-test.txt > "$(dirname "$venv")/req.txt"
"$venv/bin/python" -m pip install -q -r "$(dirname "$venv")/req.txt"
"$venv/bin/python" -m pip install -q dist/treecask-*.whl
where=$(cd / && "$venv/bin/python" -c 'import treecask, os; print(os.path.dirname(treecask.__file__))')
case "$where" in
  "$venv"/*) echo "wheel_test: treecask imported from $where" ;;
  *) echo "wheel_test: treecask imported from $where, not the fresh venv" >&2; exit 1 ;;
esac
# No library outside the wheel but the system's basics (libc, libstdc++...).
"$venv/bin/python" - <<'PY'
import glob, os, subprocess, treecask
so = glob.glob(os.path.join(os.path.dirname(treecask.__file__), "_core*.so"))[0]
deps = subprocess.run(["ldd", so], capture_output=True, text=True, check=True).stdout
for lib in ("liblmdb", "liblz4", "libxxhash"):
    line = next(l for l in deps.splitlines() if lib in l)
    assert "treecask.libs" in line, f"{lib} is not bundled: {line.strip()}"
print("wheel_test: LMDB, LZ4 and xxHash load from the wheel")
PY
export TREECASK_CLI="$PWD/${BUILD_DIR:-build}/src/cli/treecask"
# The SIGKILL soak of test_manager.py already ran 200 kills against the source install; here it
# checks the wheel with fewer (scripts/manager_soak.sh runs thousands).
TREECASK_SOAK=${TREECASK_SOAK:-40} "$venv/bin/python" -m pytest tests/python -q -p no:cacheprovider
