#!/usr/bin/env bash
# The wheel test (run by scripts/test.sh): builds the manylinux wheel
# (scripts/wheel.sh); installs it alone into a fresh virtual environment (pip
# brings its dependencies, NumPy and ml_dtypes) and checks that the `treecask`
# command runs there (--version, save -> ls / verify / get / export,
# import-flax); then installs it into another fresh environment holding only
# PyPI packages and runs the CLI tests (tests/cli) against the tool in it and
# the Python test suite against that install.
# Fails if `import treecask` resolves anywhere but the fresh environment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/wheel.sh
venv=$(mktemp -d)/venv
bare=$(dirname "$venv")/bare
trap 'rm -rf "$(dirname "$venv")"' EXIT

# 1. The `treecask` command from the wheel, with nothing else installed.
python3 -m venv "$bare"
"$bare/bin/python" -m pip install -q dist/treecask-*.whl
(
  cd "$(dirname "$bare")"
  PATH="$bare/bin:$PATH"
  [ "$(command -v treecask)" = "$bare/bin/treecask" ]
  treecask --version | grep -q "^treecask [0-9.]* (format "
  python -c 'import numpy as np, treecask; treecask.save("w.cask", {"w": np.arange(6.0).reshape(2, 3)})'
  treecask ls w.cask | grep -q '^w  *float64  *\[2,3\]'
  treecask verify w.cask | grep -q '^OK: 1 leaves'
  treecask get w.cask w -o w.npy >/dev/null
  treecask export w.cask w.safetensors >/dev/null
  python -c 'import numpy as np; assert (np.load("w.npy") == np.arange(6.0).reshape(2, 3)).all()'
  # The Python commands run from it too; here without flax: exit 10, naming it.
  treecask import-flax --help | grep -q msgpack_restore
  rc=0; treecask import-flax w.cask x.cask 2>err.txt || rc=$?
  [ "$rc" = 10 ] && grep -q "pip install flax" err.txt
)
echo "wheel_test: the wheel's treecask command runs in a bare venv ($("$bare/bin/treecask" --version))"

# 2. The Python test suite against the wheel.
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
here = os.path.dirname(treecask.__file__)
so = glob.glob(os.path.join(here, "_core*.so"))[0]
for elf, libs in ((so, ("liblmdb", "liblz4", "libxxhash")),
                  (os.path.join(here, "_bin", "treecask"), ("liblmdb", "liblz4", "libxxhash", "libzip"))):
    deps = subprocess.run(["ldd", elf], capture_output=True, text=True, check=True).stdout
    assert "not found" not in deps, deps
    for lib in libs:
        line = next(l for l in deps.splitlines() if lib in l)
        assert "treecask.libs" in line, f"{elf}: {lib} is not bundled: {line.strip()}"
print("wheel_test: LMDB, LZ4 and xxHash (and libzip for the tool) load from the wheel")
PY
# Every CLI test against the tool in the wheel, called directly: its bundled libraries,
# without the entry point's Python start per call (checked above and by test_entry_point.py).
TREECASK_CLI="$("$venv/bin/python" -c 'from treecask import _cli; print(_cli.tool_path())')" \
  "$venv/bin/python" -m pytest tests/cli/test_cli_tool.py -q -p no:cacheprovider
# The Python suite's CLI tests use the CMake build's tool (it reads URLs: libcurl).
export TREECASK_CLI="$PWD/${BUILD_DIR:-build}/src/cli/treecask"
# The SIGKILL soak of test_manager.py already ran 200 kills against the source install; here it
# checks the wheel with fewer (scripts/manager_soak.sh runs thousands).
TREECASK_SOAK=${TREECASK_SOAK:-40} "$venv/bin/python" -m pytest tests/python -q -p no:cacheprovider
