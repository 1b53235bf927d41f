"""Workflow 6: archives written from Python are read by the C++ CLI, and
archives written by the CLI (from safetensors / npz) are read from Python.

The CLI binary is found through the TREECASK_CLI environment variable, e.g.
``TREECASK_CLI=build/src/cli/treecask pytest tests/python``.
"""

import json
import os
import subprocess

import ml_dtypes
import numpy as np
import pytest

import treecask
from conftest import bits, file_offset_of

CLI = os.environ.get("TREECASK_CLI")
pytestmark = pytest.mark.skipif(
    not CLI, reason="TREECASK_CLI is not set (point it at the built CLI, e.g. build/src/cli/treecask)")


def cli(*args, check=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120)
    if check:
        assert r.returncode == 0, (args, r.returncode, r.stdout, r.stderr)
    return r


def _tree():
    rng = np.random.default_rng(0)
    return {
        "params": {"w": rng.standard_normal((16, 8)).astype(np.float32),
                   "b": np.zeros(8, ml_dtypes.bfloat16),
                   "q": np.arange(-8, 8).astype(ml_dtypes.int4)},
        "step": 7,
        "name": "run-1",
        "layers": [np.ones(3, np.int64), None],
    }


def test_cli_reads_python_archives(cask):
    tree = _tree()
    treecask.save(cask, tree, metadata={"origin": "python"}, durable=False)
    listing = json.loads(cli("ls", cask, "--json").stdout)
    by_key = {leaf["key_path"]: leaf for leaf in listing}
    assert list(by_key) == treecask.open(cask).keys()
    assert by_key["params/w"]["dtype"] == "float32" and by_key["params/w"]["shape"] == [16, 8]
    assert by_key["params/b"]["dtype"] == "bfloat16"
    assert by_key["params/q"]["dtype"] == "int4" and by_key["params/q"]["bytes"] == 8
    assert by_key["step"]["kind"] == "int" and by_key["name"]["kind"] == "str"
    assert "origin" in cli("info", cask).stdout
    assert cli("verify", cask).stdout.startswith("OK")
    out = cask.parent / "w.npy"
    cli("get", cask, "params/w", "-o", out)
    np.testing.assert_array_equal(np.load(out), tree["params"]["w"])


def test_cli_verify_detects_damage_in_a_python_archive(cask, tmp_path):
    x = np.random.default_rng(1).standard_normal(20000)
    treecask.save(cask, {"x": x}, compression="none", durable=False)
    with treecask.open(cask) as a:
        off = file_offset_of(a["x"], cask) + 999
    data = bytearray(cask.read_bytes())
    data[off] ^= 1
    bad = tmp_path / "bad.cask"
    bad.write_bytes(bytes(data))
    r = cli("verify", bad, check=False)
    assert r.returncode == 5 and "x" in r.stdout


def test_python_reads_cli_imports(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tensors = {"enc/w": np.arange(12, dtype=np.float32).reshape(3, 4),
               "emb": np.ones((5, 2), ml_dtypes.bfloat16), "ids": np.arange(4, dtype=np.int64)}
    src = tmp_path / "m.safetensors"
    st.save_file(tensors, str(src), metadata={"format": "np"})
    dst = tmp_path / "m.cask"
    cli("import", src, dst)
    back = treecask.load(dst)
    assert set(back) == set(tensors)
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and np.array_equal(bits(back[k]), bits(v))
    with treecask.open(dst) as a:
        assert a.metadata == {"format": "np"}
        assert sorted(a.keys()) == ["emb", "enc~1w", "ids"]
        assert a.verify() == []
    # Restore into a template, like any Python-written archive.
    like = {k: np.zeros_like(v) for k, v in tensors.items()}
    np.testing.assert_array_equal(treecask.load(dst, like=like)["enc/w"], tensors["enc/w"])

    npz = tmp_path / "a.npz"
    np.savez(npz, a=np.arange(3), b=np.eye(2))
    cli("import", npz, tmp_path / "a.cask")
    got = treecask.load(tmp_path / "a.cask")
    np.testing.assert_array_equal(got["a"], np.arange(3))
    np.testing.assert_array_equal(got["b"], np.eye(2))


def test_cli_exports_python_archives_to_safetensors(cask, tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    tree = {"enc": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "b": np.ones(2, ml_dtypes.bfloat16)}
    treecask.save(cask, tree, metadata={"k": "v"}, durable=False)
    out = tmp_path / "out.safetensors"
    cli("export", cask, out)
    got = st.load_file(str(out))
    np.testing.assert_array_equal(got["enc/w"], tree["enc"]["w"])
    assert got["b"].dtype == ml_dtypes.bfloat16
