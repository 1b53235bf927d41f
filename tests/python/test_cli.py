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


def test_safetensors_0_8_dtypes_import_export_byte_identical(tmp_path):
    """F4, F6_E2M3, F6_E3M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ (safetensors 0.8):
    a file the safetensors package writes (F4 and the float8s through its own
    serializer; F6, which its Python API cannot write, with the same header)
    imports into a format 4.0 archive whose leaves are the ml_dtypes arrays
    (sub-byte ones unpacked), reads by rows and slices, and exports
    byte-identical, which safetensors reads back."""
    safetensors = pytest.importorskip("safetensors")
    from treecask import _dtypes

    rng = np.random.default_rng(3)

    def codes(name, shape):
        return rng.integers(0, 1 << _dtypes.BITS.get(name, 8), int(np.prod(shape)), dtype=np.uint8).view(
            _dtypes.to_numpy(name)).reshape(shape)

    want = {
        "f4": codes("float4_e2m1fn", (6, 10)),
        "e8m0": codes("float8_e8m0fnu", (4, 3)),
        "e4fnuz": codes("float8_e4m3fnuz", (5,)),
        "e5fnuz": codes("float8_e5m2fnuz", (3, 2)),
        "f6a": codes("float6_e2m3fn", (4, 6)),
        "f6b": codes("float6_e3m2fn", (12,)),
    }

    # F4 packed as PyTorch's float4_e2m1fn_x2 holds it: element 2k in the low nibble.
    def f4_bytes(a):
        v = a.reshape(-1).view(np.uint8)
        return (v[0::2] | (v[1::2] << np.uint8(4))).astype(np.uint8)

    # F6: element k at bits [6k, 6k + 6) of the little-endian bit stream (SPEC.md "Dtypes").
    def f6_bytes(a):
        stream = sum(int(c) << (6 * k) for k, c in enumerate(a.reshape(-1).view(np.uint8)))
        return np.frombuffer(stream.to_bytes(a.size * 6 // 8, "little"), np.uint8)

    keep = []

    def spec(dtype, arr, data):
        data = np.ascontiguousarray(data, np.uint8)
        keep.append(data)
        return safetensors.TensorSpec(dtype=dtype, shape=list(arr.shape), data_ptr=data.ctypes.data,
                                      data_len=data.size)

    # TensorSpec takes the storage shape of a packed dtype (two F4 per byte) and doubles the last dim.
    f4 = want["f4"]
    f4_spec = safetensors.TensorSpec(dtype="float4_e2m1fn_x2", shape=[6, 5], data_ptr=0, data_len=0)
    assert list(f4_spec.shape) == [6, 10]
    specs = {
        "f4": spec("float4_e2m1fn_x2", np.empty((6, 5)), f4_bytes(f4)),
        "e8m0": spec("float8_e8m0fnu", want["e8m0"], want["e8m0"].view(np.uint8)),
        "e4fnuz": spec("float8_e4m3fnuz", want["e4fnuz"], want["e4fnuz"].view(np.uint8)),
        "e5fnuz": spec("float8_e5m2fnuz", want["e5fnuz"], want["e5fnuz"].view(np.uint8)),
    }
    src = tmp_path / "mx.safetensors"
    safetensors.serialize_file(specs, str(src), {"quant": "mxfp4"})
    st_bytes = src.read_bytes()
    # The F6 file, with the header the reference writes (compact JSON, padded to 8).
    header, blobs, off = {}, [], 0
    for k in ("f6a", "f6b"):
        b = f6_bytes(want[k]).tobytes()
        header[k] = {"dtype": "F6_E2M3" if k == "f6a" else "F6_E3M2", "shape": list(want[k].shape),
                     "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    f6src = tmp_path / "f6.safetensors"
    f6src.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))
    parsed = dict(safetensors.deserialize(f6src.read_bytes()))  # the reference accepts it
    assert parsed["f6a"]["dtype"] == "F6_E2M3" and parsed["f6a"]["shape"] == [4, 6]

    for path in (src, f6src):
        dst = tmp_path / (path.stem + ".cask")
        cli("import", path, dst)
        with treecask.open(dst) as a:
            assert a.format_version == (4, 0)
            for k in a.keys():
                got, w = a[k], want[k]
                assert got.dtype == w.dtype and np.array_equal(bits(got), bits(w)), k
                if w.ndim == 2:
                    np.testing.assert_array_equal(bits(a.read_slice(k, (slice(1, 3), slice(1, None)))),
                                                  bits(w[1:3, 1:]))
                    np.testing.assert_array_equal(bits(a.read_rows(k, 1, 3)), bits(w[1:3]))
        out = tmp_path / (path.stem + ".out.safetensors")
        cli("export", dst, out)
        assert out.read_bytes() == path.read_bytes(), f"{path.name}: export is not byte-identical"
    back = dict(safetensors.deserialize(st_bytes))
    assert back["f4"]["dtype"] == "F4" and bytes(back["f4"]["data"]) == f4_bytes(f4).tobytes()
    assert back["e8m0"]["dtype"] == "F8_E8M0"


def test_export_refuses_what_safetensors_cannot_hold(tmp_path):
    """int2 and float8_e4m3 have no safetensors dtype; a float4 leaf of an odd
    element count does not fill whole bytes: exit status 10, naming the leaf."""
    for name, arr in (("i2", np.zeros(4, ml_dtypes.int2)), ("e4m3", np.zeros(3, ml_dtypes.float8_e4m3)),
                      ("f4odd", np.zeros(3, ml_dtypes.float4_e2m1fn))):
        src = tmp_path / f"{name}.cask"
        treecask.save(src, {name: arr}, durable=False)
        r = cli("export", src, tmp_path / f"{name}.safetensors", check=False)
        assert r.returncode == 10 and name in r.stderr, r
