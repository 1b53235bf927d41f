"""The `treecask` command that `pip install` (of the wheel or of the source)
puts beside the interpreter: the C++ tool built into the package, reached
through the entry point treecask/_cli.py, and the Python commands
(import-orbax, import-flax) dispatched from it. scripts/wheel_test.sh checks
the same in a virtual environment holding only the wheel."""

import os
import subprocess
import sys

import numpy as np
import pytest

import treecask
from treecask import _cli

COMMAND = os.path.join(os.path.dirname(sys.executable), "treecask")
pytestmark = pytest.mark.skipif(not os.path.exists(COMMAND),
                                reason=f"no treecask command beside {sys.executable} (pip install the package)")


def run(*args):
    return subprocess.run([COMMAND, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_version_is_the_packages():
    assert os.access(_cli.tool_path(), os.X_OK)
    r = run("--version")
    assert r.returncode == 0, r.stderr
    major, minor = treecask.FORMAT_VERSION
    assert r.stdout.strip() == f"treecask {treecask.library_version()} (format {major}.{minor})"


def test_every_subcommand_of_the_tool(tmp_path):
    cask = tmp_path / "w.cask"
    treecask.save(cask, {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": 3})
    r = run("ls", cask)
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[:3] == ["w", "float32", "[2,3]"], r
    assert run("info", cask).returncode == 0
    assert run("verify", cask).stdout.startswith("OK: 2 leaves")
    assert run("get", cask, "w", "-o", tmp_path / "w.npy").returncode == 0
    assert np.array_equal(np.load(tmp_path / "w.npy"), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert run("export", cask, tmp_path / "w.safetensors").returncode == 10  # "step" is a Python int
    r = run("import", tmp_path / "w.npy", tmp_path / "n.cask", "--format", "npz")
    assert r.returncode == 5, r  # a .npy given as --format npz is no zip: a damaged .npz (corruption)
    r = run("frobnicate")
    assert r.returncode == 1 and "unknown subcommand 'frobnicate'" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "import-flax" in r.stdout


def test_python_commands_dispatch(tmp_path):
    r = run("import-flax", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: treecask import-flax")
    r = run("import-orbax", tmp_path / "missing", tmp_path / "a.cask")
    assert r.returncode == 2 and str(tmp_path / "missing") in r.stderr
