"""Tests of the `treecask` command-line tool on small synthetic inputs, run by
pytest like every other Python-driven test (tests/python/test_cli.py covers
archives passed between the CLI and the Python package).

Usage: TREECASK_CLI=/path/to/treecask python -m pytest tests/cli [-k SUBSTRING]
(ctest's `cli` entry does this through run_cli_test.sh with the built binary.)

Needs numpy, safetensors and ml_dtypes (the project's .venv has them); skipped
when they are missing or TREECASK_CLI is unset. Each test works in its own
temporary directory. Checks: import/export round trip of every safetensors
dtype (byte-identical files), .npz import, get -> .npy, ls --json, info, verify
on intact and damaged archives, every documented exit status, and malformed
safetensors headers that must be refused with a clear message.
"""
import json
import os
import pty
import struct
import subprocess
import zipfile

import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")
np = pytest.importorskip("numpy")
load_file = pytest.importorskip("safetensors.numpy").load_file
save_file = pytest.importorskip("safetensors.numpy").save_file

TREECASK = os.path.abspath(os.environ["TREECASK_CLI"]) if os.environ.get("TREECASK_CLI") else None
pytestmark = pytest.mark.skipif(
    not TREECASK, reason="TREECASK_CLI is not set (point it at the built CLI, e.g. build/src/cli/treecask)")


@pytest.fixture
def d(tmp_path):
    """The test's own temporary directory, as a str."""
    return str(tmp_path)

# Exit statuses, docs/cli.md "Exit codes".
OK, USAGE, NOT_FOUND, NOT_ARCHIVE, DAMAGED, KEY_NOT_FOUND, INVALID, EXISTS, UNSUPPORTED = (
    0, 1, 2, 3, 5, 6, 7, 9, 10)

ALL_ST_DTYPES = {
    "BOOL": np.dtype(bool), "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
    "U16": np.dtype(np.uint16), "I16": np.dtype(np.int16), "U32": np.dtype(np.uint32),
    "I32": np.dtype(np.int32), "U64": np.dtype(np.uint64), "I64": np.dtype(np.int64),
    "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16),
    "F32": np.dtype(np.float32), "F64": np.dtype(np.float64), "C64": np.dtype(np.complex64),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn), "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    # safetensors 0.8, treecask format 4.0
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu), "F8_E4M3FNUZ": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "F8_E5M2FNUZ": np.dtype(ml_dtypes.float8_e5m2fnuz),
}
TREECASK_NAMES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "U16": "uint16", "I16": "int16",
    "U32": "uint32", "I32": "int32", "U64": "uint64", "I64": "int64", "F16": "float16",
    "BF16": "bfloat16", "F32": "float32", "F64": "float64", "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E8M0": "float8_e8m0fnu", "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz",
}


class Result:
    def __init__(self, proc):
        self.code = proc.returncode
        self.out = proc.stdout.decode("utf-8", "replace")
        self.err = proc.stderr.decode("utf-8", "replace")

    def __repr__(self):
        return f"exit {self.code}\n--- stdout\n{self.out}--- stderr\n{self.err}"


def tc(*args):
    return Result(subprocess.run([TREECASK, *map(str, args)], capture_output=True, timeout=120))


def expect(result, code, err_contains=None, out_contains=None):
    assert result.code == code, f"expected exit {code}, got {result!r}"
    if code != OK:
        assert result.err.startswith("treecask") or code == USAGE, f"no error message: {result!r}"
    if err_contains is not None:
        assert err_contains in result.err, f"stderr lacks {err_contains!r}: {result!r}"
    if out_contains is not None:
        assert out_contains in result.out, f"stdout lacks {out_contains!r}: {result!r}"
    return result


def random_array(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype == bool:
        return rng.integers(0, 2, size=shape).astype(bool)
    # Random bytes: every bit pattern (NaNs included) must survive unchanged.
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


def write_safetensors(path, header, data=b"", pad=True, length=None):
    """A safetensors file as the reference writer makes it, from a header object
    (or raw header bytes), with optional overrides to craft broken files."""
    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text) if length is None else length))
        f.write(text)
        f.write(data)


def safetensors_from_arrays(path, arrays, metadata=None):
    """Writes `arrays` (any dtypes, ml_dtypes included) in the given order."""
    header, blobs, offset = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    inverse = {v: k for k, v in ALL_ST_DTYPES.items()}
    for name, a in arrays.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": inverse[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    write_safetensors(path, header, b"".join(blobs))


def ls_json(cask):
    r = expect(tc("ls", cask, "--json"), OK)
    return json.loads(r.out)


def same_file(a, b):
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


# ---- round trips -----------------------------------------------------------------

def test_roundtrip_every_safetensors_dtype(d):
    rng = np.random.default_rng(1)
    arrays = {f"t_{k.lower()}": random_array(rng, dt, (3, 5)) for k, dt in ALL_ST_DTYPES.items()}
    arrays["scalar"] = np.array(7, np.int32)
    arrays["empty"] = np.zeros((0, 4), np.float32)
    src = f"{d}/all.safetensors"
    safetensors_from_arrays(src, arrays, metadata={"format": "pt", "b": "2", "a": "1"})
    for compression in ("auto", "none", "lz4"):
        cask = f"{d}/all.{compression}.cask"
        expect(tc("import", src, cask, "--compression", compression), OK, out_contains="21 leaves")
        leaves = ls_json(cask)
        assert [l["key_path"] for l in leaves] == list(arrays), leaves
        for l in leaves:
            a = arrays[l["key_path"]]
            assert l["shape"] == list(a.shape), l
            assert l["bytes"] == a.nbytes, l
        for k in ALL_ST_DTYPES:
            leaf = next(l for l in leaves if l["key_path"] == f"t_{k.lower()}")
            assert leaf["dtype"] == TREECASK_NAMES[k], leaf
        if compression == "none":
            assert all(l["codec"] == "none" for l in leaves)
        out = f"{d}/all.{compression}.safetensors"
        expect(tc("export", cask, out), OK, out_contains="21 tensors")
        assert same_file(src, out), f"export with --compression {compression} is not byte-identical"


def test_roundtrip_packed_safetensors_dtypes(d):
    """F4, F6_E2M3 and F6_E3M2 (packed: elements x bits / 8 bytes) import as
    float4_e2m1fn / float6_e2m3fn / float6_e3m2fn leaves of format 4.0 with
    the tensor's bytes unchanged, and export byte-identical."""
    rng = np.random.default_rng(5)
    tensors = [("f4", "F4", [3, 6], 9), ("f6a", "F6_E2M3", [4, 3], 9), ("f6b", "F6_E3M2", [8], 6),
               ("f4_empty", "F4", [0, 2], 0), ("e8m0", "F8_E8M0", [5], 5)]
    header, blobs, offset = {"__metadata__": {"quant": "mxfp"}}, [], 0
    for name, dt, shape, n in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [offset, offset + n]}
        blobs.append(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
        offset += n
    src = f"{d}/packed.safetensors"
    write_safetensors(src, header, b"".join(blobs))
    for compression in ("none", "lz4"):
        cask = f"{d}/packed.{compression}.cask"
        expect(tc("import", src, cask, "--compression", compression), OK, out_contains="5 leaves")
        info = json.loads(expect(tc("info", cask, "--json"), OK).out)
        assert info["format_version"] == "4.0", info
        leaves = {l["key_path"]: l for l in ls_json(cask)}
        assert leaves["f4"]["dtype"] == "float4_e2m1fn" and leaves["f4"]["bytes"] == 9
        assert leaves["f6a"]["dtype"] == "float6_e2m3fn" and leaves["f6b"]["dtype"] == "float6_e3m2fn"
        assert leaves["e8m0"]["dtype"] == "float8_e8m0fnu"
        out = f"{d}/packed.{compression}.out.safetensors"
        expect(tc("export", cask, out), OK, out_contains="5 tensors")
        assert same_file(src, out), f"--compression {compression}: not byte-identical"
    # An F6 tensor whose elements do not fill whole bytes is malformed (the reference refuses it).
    write_safetensors(f"{d}/f6odd.safetensors", {"x": {"dtype": "F6_E2M3", "shape": [3], "data_offsets": [0, 2]}},
                      b"\0\0")
    expect(tc("import", f"{d}/f6odd.safetensors", f"{d}/f6odd.cask"), DAMAGED, err_contains="whole bytes")


def test_roundtrip_reference_writer_files(d):
    """Files written by the safetensors package itself come back byte-identical."""
    rng = np.random.default_rng(2)
    cases = {
        "plain": ({"w": rng.standard_normal((8, 8)).astype(np.float32),
                   "b": np.arange(8, dtype=np.int64)}, {"format": "pt"}),
        "zero_size": ({"b": np.zeros(0, np.float32), "a": np.zeros((2, 0), np.int8),
                       "c": np.ones(2, np.float64)}, {"z": "1", "a": "2", "m": "3"}),
        "no_metadata": ({"x": np.ones((2, 3), np.uint16)}, None),
        "empty": ({}, None),
        "odd_names": ({"enc/layer~0/w": np.ones(3, np.float32), "ünï cödé": np.zeros(2, np.int8),
                       "a.b": np.ones(1, bool)}, {"note": "quote \" slash / nl \n tab \t é"}),
    }
    for name, (arrays, metadata) in cases.items():
        src = f"{d}/{name}.safetensors"
        save_file(arrays, src, metadata=metadata)
        expect(tc("import", src, f"{d}/{name}.cask"), OK)
        expect(tc("export", f"{d}/{name}.cask", f"{d}/{name}.out.safetensors"), OK)
        assert same_file(src, f"{d}/{name}.out.safetensors"), f"{name}: not byte-identical"
        back = load_file(f"{d}/{name}.out.safetensors")
        assert set(back) == set(arrays)
        for k, a in arrays.items():
            assert back[k].dtype == a.dtype and back[k].shape == a.shape
            assert back[k].tobytes() == a.tobytes()
    leaves = ls_json(f"{d}/odd_names.cask")
    assert sorted(l["key_path"] for l in leaves) == sorted(["enc~1layer~00~1w", "ünï cödé", "a.b"])
    info = json.loads(expect(tc("info", f"{d}/odd_names.cask", "--json"), OK).out)
    assert info["metadata"] == cases["odd_names"][1], info


def test_large_lz4_leaf_exports_in_row_batches(d):
    """A > 64 MiB LZ4 leaf is read back in row batches by export and get."""
    a = (np.arange(17 * (1 << 20), dtype=np.uint32) % 1000).reshape(17, 1 << 20)
    src = f"{d}/big.safetensors"
    save_file({"big": a, "small": np.ones(3, np.float32)}, src)
    expect(tc("import", src, f"{d}/big.cask", "--compression", "lz4", "--chunk-size", 65536), OK)
    leaf = next(l for l in ls_json(f"{d}/big.cask") if l["key_path"] == "big")
    assert leaf["codec"] == "lz4" and leaf["stored_bytes"] < leaf["bytes"], leaf
    assert leaf["chunk_size"] == 65536, leaf
    expect(tc("export", f"{d}/big.cask", f"{d}/big.out.safetensors"), OK)
    assert same_file(src, f"{d}/big.out.safetensors")
    expect(tc("get", f"{d}/big.cask", "big", "-o", f"{d}/big.npy"), OK)
    assert np.array_equal(np.load(f"{d}/big.npy"), a)


def test_import_shuffle(d):
    """--shuffle: bf16 weights with a repeated high byte compress; 2.0; exact export."""
    import ml_dtypes
    rng = np.random.default_rng(5)
    bf = (rng.standard_normal((512, 256)) * 0.02).astype(ml_dtypes.bfloat16)
    arrays = {"w": bf, "ids": np.arange(4096, dtype=np.int64), "mask": np.ones(999, np.uint8)}
    src = f"{d}/w.safetensors"
    save_file(arrays, src)
    expect(tc("import", src, f"{d}/plain.cask", "--compression", "lz4"), OK)
    expect(tc("import", src, f"{d}/shuf.cask", "--compression", "lz4", "--shuffle"), OK)
    plain = {l["key_path"]: l for l in ls_json(f"{d}/plain.cask")}
    shuf = {l["key_path"]: l for l in ls_json(f"{d}/shuf.cask")}
    assert shuf["w"]["filter"] == "shuffle" and shuf["ids"]["filter"] == "shuffle", shuf
    assert shuf["mask"]["filter"] == "none", shuf  # 1-byte elements: no filter
    assert plain["w"]["filter"] == "none"
    assert shuf["w"]["stored_bytes"] < 0.9 * plain["w"]["stored_bytes"], (shuf["w"], plain["w"])
    text = expect(tc("ls", f"{d}/shuf.cask", "w"), OK).out.split()
    assert text[-1] == "lz4+shuffle", text
    assert json.loads(expect(tc("info", f"{d}/shuf.cask", "--json"), OK).out)["format_version"] == "2.0"
    assert json.loads(expect(tc("info", f"{d}/plain.cask", "--json"), OK).out)["format_version"] == "1.0"
    expect(tc("verify", f"{d}/shuf.cask"), OK)
    expect(tc("export", f"{d}/shuf.cask", f"{d}/back.safetensors"), OK)
    assert same_file(src, f"{d}/back.safetensors")


# ---- npz ------------------------------------------------------------------------

def test_npz_import(d):
    rng = np.random.default_rng(3)
    arrays = {
        "w": rng.standard_normal((4, 3)).astype(np.float32),
        "flag": np.array(True),
        "ids": np.arange(10, dtype=np.int64),
        "c": (rng.standard_normal(3) + 1j * rng.standard_normal(3)).astype(np.complex128),
        "h": rng.standard_normal(5).astype(np.float16),
        "empty": np.zeros((0, 3), np.uint8),
        "nested/name": np.ones(2, np.int16),
        "fortran_1d": np.asfortranarray(np.arange(4, dtype=np.int32)),
    }
    for saver in (np.savez, np.savez_compressed):
        path = f"{d}/{saver.__name__}.npz"
        saver(path, **arrays)
        cask = f"{d}/{saver.__name__}.cask"
        expect(tc("import", path, cask), OK, out_contains="from npz")
        leaves = ls_json(cask)
        assert [l["key_path"] for l in leaves] == [k.replace("/", "~1") for k in arrays], leaves
        for l in leaves:
            key = l["key_path"]
            out = f"{d}/{saver.__name__}.{len(os.listdir(d))}.npy"
            expect(tc("get", cask, key, "-o", out), OK)
            got = np.load(out)
            want = arrays[key.replace("~1", "/")]
            assert got.dtype == want.dtype and got.shape == want.shape, (key, got, want)
            assert np.array_equal(got, want), key
        # complex128 has no safetensors dtype.
        expect(tc("export", cask, f"{d}/x.safetensors"), UNSUPPORTED, err_contains="complex128")
        assert not os.path.exists(f"{d}/x.safetensors")
    # --format overrides the extension.
    os.rename(f"{d}/savez.npz", f"{d}/arrays.bin")
    expect(tc("import", f"{d}/arrays.bin", f"{d}/bin.cask"), OK, out_contains="from npz")
    expect(tc("import", f"{d}/arrays.bin", f"{d}/bin2.cask", "--format", "safetensors"), DAMAGED)


def test_npz_bad_inputs(d):
    def npz(name, members):
        with zipfile.ZipFile(f"{d}/{name}.npz", "w") as z:
            for member, data in members.items():
                z.writestr(member, data)
        return f"{d}/{name}.npz"

    def npy(a):
        import io
        buf = io.BytesIO()
        np.save(buf, a, allow_pickle=True)
        return buf.getvalue()

    cases = {
        "not_npy": ({"readme.txt": b"hello"}, "not a .npy", INVALID),
        "big_endian": ({"x.npy": npy(np.arange(3, dtype=">f4"))}, "big-endian", INVALID),
        "fortran": ({"x.npy": npy(np.asfortranarray(np.ones((2, 3), np.float32)))}, "Fortran", INVALID),
        "object": ({"x.npy": npy(np.array([1, "a"], dtype=object))}, "not supported", INVALID),
        "truncated_npy": ({"x.npy": npy(np.ones(10, np.float64))[:-8]}, "imply", DAMAGED),
        "bad_magic": ({"x.npy": b"\x93NUMPX" + b"\0" * 60}, "bad magic", DAMAGED),
    }
    for name, (members, message, code) in cases.items():
        r = expect(tc("import", npz(name, members), f"{d}/{name}.cask"), code, err_contains=message)
        assert not os.path.exists(f"{d}/{name}.cask"), name
    # A damaged deflated member: CRC or inflate error.
    path = f"{d}/crc.npz"
    np.savez_compressed(path, x=np.arange(10000, dtype=np.int64))
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    expect(tc("import", path, f"{d}/crc.cask"), DAMAGED, err_contains="npz")
    # Truncated zip.
    np.savez(f"{d}/trunc.npz", x=np.arange(100))
    data = open(f"{d}/trunc.npz", "rb").read()
    open(f"{d}/trunc.npz", "wb").write(data[: len(data) // 2])
    expect(tc("import", f"{d}/trunc.npz", f"{d}/trunc.cask"), DAMAGED)


def test_damaged_npz_is_corruption(d):
    """A damaged .npz (its zip, or a member's bytes) is corruption (exit 5) naming the file and
    the member; a valid member the tool does not take stays an invalid argument (exit 7)."""
    np.savez(f"{d}/good.npz", weights=np.arange(1000, dtype=np.int32))
    data = bytearray(open(f"{d}/good.npz", "rb").read())
    at = data.index(b"\x93NUMPY") + 200  # inside the stored member's data: its CRC-32 fails
    data[at] ^= 0xFF
    open(f"{d}/flipped.npz", "wb").write(bytes(data))
    r = expect(tc("import", f"{d}/flipped.npz", f"{d}/flipped.cask"), DAMAGED, err_contains="npz")
    assert r.err.startswith(f"treecask: {d}/flipped.npz: weights: corruption: "), r
    open(f"{d}/notzip.npz", "wb").write(b"PK\3\4" + b"\0" * 100)
    expect(tc("import", f"{d}/notzip.npz", f"{d}/notzip.cask"), DAMAGED, err_contains="npz")
    assert not os.path.exists(f"{d}/flipped.cask") and not os.path.exists(f"{d}/notzip.cask")


def test_damaged_npy_header_is_corruption(d):
    """A .npy member whose header is not the dict np.save writes is corruption (exit 5) naming
    the member; a well-formed header of an array the tool does not take stays exit 7."""
    def member(header):
        prefix = b"\x93NUMPY\x01\x00"
        text = header + b" " * (-(len(prefix) + 2 + len(header) + 1) % 64) + b"\n"
        return prefix + len(text).to_bytes(2, "little") + text + b"\0" * 12

    cases = {
        "unclosed": (b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), ", DAMAGED, "expected"),
        "no_shape": (b"{'descr': '<f4', 'fortran_order': False, }", DAMAGED, "lacks 'shape'"),
        "shape_type": (b"{'descr': '<f4', 'fortran_order': False, 'shape': 'x', }", DAMAGED, "bad type"),
        "extra_key": (b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 'y', }", DAMAGED,
                      "other than"),
        "structured": (b"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", INVALID,
                       "structured"),
    }
    for name, (header, code, message) in cases.items():
        path = f"{d}/{name}.npz"
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("x.npy", member(header))
        r = expect(tc("import", path, f"{d}/{name}.cask"), code, err_contains=message)
        assert r.err.startswith(f"treecask: {path}: x: "), r
        assert not os.path.exists(f"{d}/{name}.cask"), name


def test_malformed_safetensors_index_is_corruption(d):
    """A Hugging Face index that is not the JSON object transformers writes, or that disagrees
    with its shards, is corruption (exit 5) naming the index or the shard; a directory with
    several candidates stays an invalid argument (exit 7)."""
    save_file({"a": np.ones(3, np.float32)}, f"{d}/model-00001-of-00001.safetensors")
    index = f"{d}/model.safetensors.index.json"
    cases = {
        "not_json": ('{"weight_map": ', "not valid JSON"),
        "no_weight_map": ('{"metadata": {}}', "no \"weight_map\""),
        "escape": ('{"weight_map": {"a": "../model-00001-of-00001.safetensors"}}', "file name"),
        "not_in_index": ('{"weight_map": {"b": "model-00001-of-00001.safetensors"}}', "not in the index"),
        "not_held": ('{"weight_map": {"a": "model-00001-of-00001.safetensors", '
                     '"b": "model-00001-of-00001.safetensors"}}', "does not hold"),
    }
    for name, (text, message) in cases.items():
        open(index, "w").write(text)
        r = expect(tc("import", d, f"{d}/{name}.cask"), DAMAGED, err_contains=message)
        assert ": corruption: " in r.err, r
        assert not os.path.exists(f"{d}/{name}.cask"), name
    os.remove(index)
    save_file({"b": np.ones(3, np.float32)}, f"{d}/other.safetensors")
    expect(tc("import", d, f"{d}/two.cask"), INVALID, err_contains="several .safetensors files")


# ---- get, ls, info, verify ------------------------------------------------------

def make_archive(d, name="m", compression="none"):
    rng = np.random.default_rng(4)
    arrays = {
        "w": rng.standard_normal((16, 8)).astype(np.float32),
        "bias": np.arange(8, dtype=np.float64),
        "bf": random_array(rng, ml_dtypes.bfloat16, (2, 3)),
        "f8": random_array(rng, ml_dtypes.float8_e4m3fn, (4,)),
        "zero_d": np.array(3.5, np.float32),
        "mask": np.array([True, False, True]),
    }
    src = f"{d}/{name}.safetensors"
    safetensors_from_arrays(src, arrays, metadata={"format": "pt", "step": "1000"})
    cask = f"{d}/{name}.cask"
    expect(tc("import", src, cask, "--compression", compression), OK)
    return cask, arrays


def test_get(d):
    cask, arrays = make_archive(d)
    for key in ("w", "bias", "zero_d", "mask"):
        r = expect(tc("get", cask, key, "-o", f"{d}/{key}.npy"), OK, out_contains="wrote")
        got = np.load(f"{d}/{key}.npy")
        assert got.dtype == arrays[key].dtype and got.shape == arrays[key].shape, key
        assert np.array_equal(got, arrays[key]), key
        # The data starts 64-byte aligned, as np.save makes it.
        raw = open(f"{d}/{key}.npy", "rb").read()
        assert (len(raw) - arrays[key].nbytes) % 64 == 0
    for key in ("bf", "f8"):
        expect(tc("get", cask, key, "-o", f"{d}/{key}.npy"), UNSUPPORTED, err_contains="--raw")
        assert not os.path.exists(f"{d}/{key}.npy")
        expect(tc("get", cask, key, "-o", f"{d}/{key}.npy", "--raw"), OK)
        got = np.load(f"{d}/{key}.npy")
        assert got.dtype == np.uint8 and got.ndim == 1
        back = got.view(arrays[key].dtype).reshape(arrays[key].shape)
        assert back.tobytes() == arrays[key].tobytes()
    expect(tc("get", cask, "nope", "-o", f"{d}/nope.npy"), KEY_NOT_FOUND, err_contains="nope")
    expect(tc("get", cask, "w", "-o", f"{d}/w.npy"), EXISTS, err_contains="--overwrite")
    expect(tc("get", cask, "w", "-o", f"{d}/w.npy", "--overwrite"), OK)
    expect(tc("get", cask, "w"), USAGE)  # -o is required


def test_ls_and_info(d):
    cask, arrays = make_archive(d, compression="auto")
    leaves = ls_json(cask)
    fields = ["index", "key_path", "kind", "dtype", "shape", "bytes", "stored_bytes", "codec",
              "chunk_size", "num_chunks", "logical_axes", "sharding", "metadata", "filter"]
    for i, (leaf, key) in enumerate(zip(leaves, arrays)):
        assert list(leaf) == fields, list(leaf)
        assert leaf["index"] == i and leaf["key_path"] == key and leaf["kind"] == "array"
        assert leaf["codec"] in ("none", "lz4") and leaf["sharding"] is None
        assert leaf["logical_axes"] == [] and leaf["metadata"] == {} and leaf["filter"] == "none"
    assert leaves[0]["dtype"] == "float32" and leaves[0]["shape"] == [16, 8]
    assert leaves[0]["bytes"] == 512
    text = expect(tc("ls", cask), OK).out.splitlines()
    assert len(text) == len(arrays)
    assert text[0].split() == ["w", "float32", "[16,8]", "512", str(leaves[0]["stored_bytes"]),
                               leaves[0]["codec"]], text[0]
    assert text[4].split()[:3] == ["zero_d", "float32", "[]"], text[4]
    # A prefix selects whole components only.
    sub = json.loads(expect(tc("ls", cask, "bias", "--json"), OK).out)
    assert [l["key_path"] for l in sub] == ["bias"]
    expect(tc("ls", cask, "bi"), KEY_NOT_FOUND)
    expect(tc("ls", cask, "", "--json"), OK)

    info = json.loads(expect(tc("info", cask, "--json"), OK).out)
    assert info["format_version"] == "1.0" and info["leaves"] == len(arrays)
    assert info["raw_bytes"] == sum(a.nbytes for a in arrays.values())
    assert info["stored_bytes"] == sum(l["stored_bytes"] for l in leaves)
    assert info["file_bytes"] == os.path.getsize(cask)
    assert info["metadata"] == {"format": "pt", "step": "1000"}
    assert abs(info["compression_ratio"] - info["raw_bytes"] / info["stored_bytes"]) < 1e-9
    assert info["created"].endswith("Z") and info["created_unix_ns"] > 0
    text = expect(tc("info", cask), OK).out
    for label in ("format version:    1.0", "writer library:", "created:", "leaves:            6",
                  f"file size:         {os.path.getsize(cask)}", "compression ratio:",
                  "  format: pt", "  step: 1000"):
        assert label in text, (label, text)


def test_verify_detects_damage(d):
    rng = np.random.default_rng(5)
    victim = rng.integers(0, 256, size=256 * 1024, dtype=np.uint8)  # random: stays raw
    src = f"{d}/v.safetensors"
    save_file({"victim": victim, "other": np.ones(1000, np.float32)}, src)
    cask = f"{d}/v.cask"
    expect(tc("import", src, cask, "--compression", "none"), OK)
    expect(tc("verify", cask), OK, out_contains="OK: 2 leaves")
    data = bytearray(open(cask, "rb").read())
    pos = data.find(victim[:64].tobytes())
    assert pos > 0, "victim bytes not found in the archive"
    data[pos + 1000] ^= 0x01
    bad = f"{d}/bad.cask"
    open(bad, "wb").write(bytes(data))
    r = expect(tc("verify", bad), DAMAGED, out_contains="DAMAGED victim",
               err_contains="1 of 2 leaves damaged")
    assert "FAILED: 1 of 2 leaves damaged" in r.out, r
    assert "DAMAGED other" not in r.out, r
    expect(tc("get", bad, "victim", "-o", f"{d}/victim.npy"), DAMAGED, err_contains="checksum")
    assert not os.path.exists(f"{d}/victim.npy")
    expect(tc("get", bad, "other", "-o", f"{d}/other.npy"), OK)
    expect(tc("export", bad, f"{d}/bad.safetensors"), DAMAGED)
    assert not any(n.startswith("bad.safetensors") for n in os.listdir(d)), os.listdir(d)


# ---- errors and exit statuses -----------------------------------------------------

def test_usage_and_missing_files(d):
    expect(tc(), USAGE)
    expect(tc("frobnicate"), USAGE)
    expect(tc("info"), USAGE)
    expect(tc("import", "a.safetensors", "b.cask", "--compression", "zstd"), USAGE)
    r = expect(tc("--help"), OK, out_contains="Exit status")
    for cmd in ("info", "ls", "verify", "get", "import", "export"):
        r = expect(tc(cmd, "--help"), OK, out_contains="Exit status")
        assert cmd in r.out
    expect(tc("--version"), OK, out_contains="format 4.1")
    missing = f"{d}/missing.cask"
    for args in (("info", missing), ("ls", missing), ("verify", missing),
                 ("get", missing, "w", "-o", f"{d}/w.npy"), ("export", missing, f"{d}/o.st"),
                 ("import", f"{d}/missing.safetensors", f"{d}/o.cask"),
                 ("import", f"{d}/missing.npz", f"{d}/o.cask")):
        expect(tc(*args), NOT_FOUND, err_contains="not found")


def test_unknown_subcommand_says_so(d):
    r = expect(tc("frobnicate", "x.cask"), USAGE, err_contains="unknown subcommand 'frobnicate'")
    assert "A subcommand is required" not in r.err
    assert "info, ls, verify, get, import, export" in r.err
    # The Python package's commands: the tool's message says where they are (the
    # `treecask` entry point that pip installs runs them itself: see their help).
    for word in ("import-flax", "import-orbax"):
        if tc(word, "--help").code == OK:
            expect(tc(word, "--help"), OK, out_contains=f"usage: treecask {word}")
        else:
            expect(tc(word, "src", "dst.cask"), USAGE, err_contains=f"python -m treecask {word}")
    expect(tc(), USAGE, err_contains="A subcommand is required")  # none given at all
    r = expect(tc("--help"), OK, out_contains="import-flax")


def test_manager_directory_names_a_step(d):
    # A CheckpointManager directory holds step_<n>.cask archives (docs/python.md):
    # each command that reads one archive says to name a step, giving the latest.
    save_file({"x": np.ones(3, np.float32)}, f"{d}/x.safetensors")
    run = f"{d}/run"
    os.mkdir(run)
    for step in (5, 12, 7):
        expect(tc("import", f"{d}/x.safetensors", f"{run}/step_{step:08d}.cask"), OK)
    hint = f"a checkpoint manager directory: name a step, e.g. {run}/step_00000012.cask"
    for args in (("info", run), ("info", run + "/"), ("ls", run), ("verify", run),
                 ("get", run, "x", "-o", f"{d}/x.npy"), ("export", run, f"{d}/x2.safetensors")):
        r = expect(tc(*args), NOT_ARCHIVE, err_contains=hint)
        assert r.err.startswith(f"treecask: {args[1]}: not an archive: "), r
    expect(tc("info", f"{run}/step_00000012.cask"), OK)
    # A directory without steps is still refused as before.
    os.mkdir(f"{d}/empty")
    r = expect(tc("info", f"{d}/empty"), NOT_ARCHIVE)
    assert "checkpoint manager" not in r.err


def test_not_an_archive(d):
    text = f"{d}/notes.txt"
    open(text, "w").write("this is not an archive\n" * 200)
    for cmd in ("info", "ls", "verify"):
        expect(tc(cmd, text), NOT_ARCHIVE, err_contains="not an archive")
    save_file({"x": np.ones(3, np.float32)}, f"{d}/x.safetensors")
    expect(tc("info", f"{d}/x.safetensors"), NOT_ARCHIVE)
    expect(tc("import", text, f"{d}/t.cask"), DAMAGED, err_contains="safetensors")


def test_output_exists(d):
    save_file({"x": np.ones(3, np.float32)}, f"{d}/x.safetensors")
    expect(tc("import", f"{d}/x.safetensors", f"{d}/x.cask"), OK)
    expect(tc("import", f"{d}/x.safetensors", f"{d}/x.cask"), EXISTS, err_contains="already exists")
    expect(tc("import", f"{d}/x.safetensors", f"{d}/x.cask", "--overwrite"), OK)
    expect(tc("export", f"{d}/x.cask", f"{d}/y.safetensors"), OK)
    expect(tc("export", f"{d}/x.cask", f"{d}/y.safetensors"), EXISTS)
    expect(tc("export", f"{d}/x.cask", f"{d}/y.safetensors", "--overwrite"), OK)
    expect(tc("import", f"{d}/x.safetensors", f"{d}/x2.cask", "--chunk-size", 1000), INVALID)


def test_malformed_safetensors(d):
    f32 = lambda shape, b, e: {"dtype": "F32", "shape": shape, "data_offsets": [b, e]}
    cases = {
        "overlap": ({"a": f32([4], 0, 16), "b": f32([4], 8, 24)}, b"\0" * 24, {}, "overlap"),
        "hole": ({"a": f32([2], 0, 8), "b": f32([2], 16, 24)}, b"\0" * 24, {}, "hole"),
        "hole_at_start": ({"a": f32([2], 8, 16)}, b"\0" * 16, {}, "hole"),
        "size_mismatch": ({"a": f32([3], 0, 16)}, b"\0" * 16, {}, "imply 12"),
        "end_before_begin": ({"a": f32([0], 8, 4), "b": f32([2], 0, 8)}, b"\0" * 8, {}, "before begin"),
        "past_end": ({"a": f32([4], 0, 16)}, b"\0" * 8, {}, "past the end"),
        "trailing": ({"a": f32([2], 0, 8)}, b"\0" * 12, {}, "trailing"),
        "unknown_dtype": ({"a": {"dtype": "F3", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, {},
                          "unknown dtype"),
        "negative_dim": ({"a": f32([-1], 0, 4)}, b"\0" * 4, {}, "non-negative"),
        "float_dim": ({"a": f32([1.5], 0, 4)}, b"\0" * 4, {}, "non-negative"),
        "bad_offsets": ({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"\0" * 4, {},
                        "data_offsets"),
        "no_dtype": ({"a": {"shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4, {}, "dtype"),
        "metadata_not_str": ({"__metadata__": {"n": 1}}, b"", {}, "not a string"),
        "not_object": ([1, 2], b"", {}, "does not start with '{'"),
        "too_large": ({"a": f32([1], 0, 4)}, b"\0" * 4, {"length": 100_000_001}, "exceeds the limit"),
        "length_past_eof": ({"a": f32([1], 0, 4)}, b"\0" * 4, {"length": 4096}, "runs past"),
        "overflow": ({"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}},
                     b"\0" * 4, {}, "overflows"),
    }
    for name, (header, data, extra, message) in cases.items():
        path = f"{d}/{name}.safetensors"
        write_safetensors(path, header, data, **extra)
        expect(tc("import", path, f"{d}/{name}.cask"), DAMAGED, err_contains=message)
        assert not os.path.exists(f"{d}/{name}.cask"), name
    raw_cases = {
        "not_json": (b"{not json}", "not valid UTF-8 JSON"),
        "bad_utf8": (b'{"a\xff":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}', "not valid UTF-8 JSON"),
        "duplicate": (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                      b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', "duplicate"),
        "junk_after": (b'{} x', "not valid UTF-8 JSON"),
        "duplicate_field": (b'{"a":{"dtype":"U8","shape":[1],"dtype":"U8","data_offsets":[0,1]}}', "duplicate"),
        "duplicate_metadata": (b'{"__metadata__":{"k":"1","k":"2"}}', "duplicate"),
        "nested_metadata": (b'{"__metadata__":{"k":{"x":"1"},"j":"2"}}', "not a string"),
        "metadata_after_array": (b'{"__metadata__":{"a":"1","k":[{"x":"1"}],"j":"2"}}', "not a string"),
    }
    for name, (text, message) in raw_cases.items():
        path = f"{d}/{name}.safetensors"
        write_safetensors(path, text, b"\0\0")
        expect(tc("import", path, f"{d}/{name}.cask"), DAMAGED, err_contains=message)
    open(f"{d}/short.safetensors", "wb").write(b"\x08\0\0")
    expect(tc("import", f"{d}/short.safetensors", f"{d}/short.cask"), DAMAGED, err_contains="shorter")
    # A sub-byte tensor whose elements do not fill whole bytes (the reference refuses it too).
    write_safetensors(f"{d}/f4odd.safetensors",
                      {"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0\0")
    expect(tc("import", f"{d}/f4odd.safetensors", f"{d}/f4odd.cask"), DAMAGED, err_contains="whole bytes")
    # Messages name the file and the tensor.
    r = tc("import", f"{d}/overlap.safetensors", f"{d}/o.cask")
    assert r.err.startswith(f"treecask: {d}/overlap.safetensors: b: corruption: "), r


def test_many_tensors_keep_their_order_both_ways(d):
    """A 20,000-tensor file (names out of sorted order, metadata keys too)
    imports in file order and exports byte-identical: the header parse keeps
    the text's order although its objects are sorted maps."""
    n = 20_000
    names = [f"t{(i * 7919) % n}" for i in range(n)]  # a permutation, not sorted
    header, offset = {"__metadata__": {"zeta": "1", "alpha": "2", "mid": "3"}}, 0
    for name in names:
        header[name] = {"dtype": "U8", "shape": [1], "data_offsets": [offset, offset + 1]}
        offset += 1
    write_safetensors(f"{d}/many.safetensors", header, bytes(i % 251 for i in range(n)))
    expect(tc("import", f"{d}/many.safetensors", f"{d}/many.cask"), OK)
    ls = expect(tc("ls", "--json", f"{d}/many.cask"), OK)
    assert [leaf["key_path"] for leaf in json.loads(ls.out)] == names
    expect(tc("export", f"{d}/many.cask", f"{d}/many.out.safetensors"), OK)
    assert open(f"{d}/many.out.safetensors", "rb").read() == open(f"{d}/many.safetensors", "rb").read()


def test_metadata_null_and_unknown_fields(d):
    """Accepted as the reference implementation accepts them."""
    header = {"__metadata__": None,
              "a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2], "extra": "ignored"}}
    write_safetensors(f"{d}/n.safetensors", header, b"\1\2")
    expect(tc("import", f"{d}/n.safetensors", f"{d}/n.cask"), OK)
    expect(tc("export", f"{d}/n.cask", f"{d}/n.out.safetensors"), OK)
    assert load_file(f"{d}/n.out.safetensors")["a"].tolist() == [1, 2]


def test_progress_only_on_a_terminal(d):
    a = np.zeros((64, 1 << 16), np.float32)
    save_file({"a": a}, f"{d}/p.safetensors")
    r = expect(tc("import", f"{d}/p.safetensors", f"{d}/p.cask"), OK)
    assert "\r" not in r.out and "\x1b" not in r.out, repr(r.out)
    # On a pseudo-terminal the tool may draw a bar but must end with the summary line.
    pid, fd = pty.fork()
    if pid == 0:  # child
        os.execv(TREECASK, [TREECASK, "export", f"{d}/p.cask", f"{d}/p.out.safetensors"])
    out = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    last = out.replace(b"\r\x1b[K", b"\n").splitlines()[-1]
    assert last.startswith(b"wrote "), out



# ---- sign, verify / get / export --signature (docs/signing.md) ------------------------

SIGNATURE = 12


def ec_key(d, name, curve="prime256v1"):
    """An EC private key and its public key as PEM files (openssl), returned as paths."""
    priv, pub = f"{d}/{name}.pem", f"{d}/{name}_pub.pem"
    if curve in ("ed25519", "rsa"):
        subprocess.run(["openssl", "genpkey", "-algorithm", curve, "-out", priv], check=True, capture_output=True)
    else:
        subprocess.run(["openssl", "ecparam", "-name", curve, "-genkey", "-noout", "-out", priv], check=True,
                       capture_output=True)
    subprocess.run(["openssl", "pkey", "-in", priv, "-pubout", "-out", pub], check=True, capture_output=True)
    return priv, pub


@pytest.fixture
def signed(d):
    """An archive of a 4 MiB leaf and a small one, its key pair, and its shard signature."""
    rng = np.random.default_rng(36)
    big = rng.integers(0, 256, size=4 << 20, dtype=np.uint8)
    src = f"{d}/w.safetensors"
    save_file({"big": big, "small": np.arange(1000, dtype=np.float32)}, src)
    cask = f"{d}/w.cask"
    expect(tc("import", src, cask, "--compression", "none"), OK)
    priv, pub = ec_key(d, "key")
    expect(tc("sign", cask, "--private-key", priv, "--shard-size", 65536), OK,
           out_contains=f"wrote {cask}.sig: signed {cask} (shards of 65536 bytes")
    return {"cask": cask, "sig": f"{cask}.sig", "priv": priv, "pub": pub, "big": big}


def test_sign_then_verify_get_export(signed, d):
    s = signed
    r = expect(tc("verify", s["cask"], "--signature", s["sig"], "--public-key", s["pub"]), OK)
    assert r.out.splitlines() == ["signature OK: every signed byte matches its SHA-256 in the statement",
                                  "OK: 2 leaves, 4198304 raw bytes verified"], r
    expect(tc("get", s["cask"], "big", "-o", f"{d}/big.npy", "--signature", s["sig"], "--public-key", s["pub"]), OK)
    assert np.array_equal(np.load(f"{d}/big.npy"), s["big"])
    expect(tc("export", s["cask"], f"{d}/w2.safetensors", "--signature", s["sig"], "--public-key", s["pub"]), OK)
    assert np.array_equal(load_file(f"{d}/w2.safetensors")["big"], s["big"])
    # File serialization, and an existing signature file is kept without --overwrite.
    expect(tc("sign", s["cask"], "--private-key", s["priv"], "--files"), 9, err_contains="already exists")
    expect(tc("sign", s["cask"], "--private-key", s["priv"], "--files", "--overwrite"), OK,
           out_contains="(file serialization,")
    expect(tc("verify", s["cask"], "--signature", s["sig"], "--public-key", s["pub"]), OK)
    # --signature needs --public-key and the other way round.
    expect(tc("verify", s["cask"], "--signature", s["sig"]), USAGE)
    expect(tc("get", s["cask"], "big", "-o", f"{d}/x.npy", "--public-key", s["pub"]), USAGE)


def test_signature_refusals_exit_12(signed, d):
    s = signed
    _, other_pub = ec_key(d, "other")
    expect(tc("verify", s["cask"], "--signature", s["sig"], "--public-key", other_pub), SIGNATURE,
           err_contains="not made with this public key")
    # Another file name.
    data = open(s["cask"], "rb").read()
    open(f"{d}/renamed.cask", "wb").write(data)
    expect(tc("get", f"{d}/renamed.cask", "small", "-o", f"{d}/s.npy", "--signature", s["sig"],
              "--public-key", s["pub"]), SIGNATURE, err_contains="is for the file 'w.cask', not 'renamed.cask'")
    # One byte of the big leaf changed: its read and a full verify fail naming the range;
    # the small leaf still reads; nothing is written for the refused one.
    b = bytearray(data)
    pos = b.find(s["big"][3 << 20:(3 << 20) + 64].tobytes())
    assert pos > 0
    b[pos] ^= 1
    os.makedirs(f"{d}/bad")
    open(f"{d}/bad/w.cask", "wb").write(bytes(b))
    shard = pos // 65536 * 65536
    want = f"bytes [{shard}, {shard + 65536}) (signed resource '.:{shard}:{shard + 65536}')"
    expect(tc("verify", f"{d}/bad/w.cask", "--signature", s["sig"], "--public-key", s["pub"]), SIGNATURE,
           err_contains=want)
    expect(tc("get", f"{d}/bad/w.cask", "big", "-o", f"{d}/big.npy", "--signature", s["sig"],
              "--public-key", s["pub"]), SIGNATURE, err_contains=want)
    assert not os.path.exists(f"{d}/big.npy")
    expect(tc("get", f"{d}/bad/w.cask", "small", "-o", f"{d}/small.npy", "--signature", s["sig"],
              "--public-key", s["pub"]), OK)
    # Appended to after signing.
    open(f"{d}/bad/w.cask", "wb").write(data + b"x")
    expect(tc("verify", f"{d}/bad/w.cask", "--signature", s["sig"], "--public-key", s["pub"]), SIGNATURE,
           err_contains="appended to after signing")
    # Unsupported key types are named; a missing key file is exit 2.
    for kind, name in (("ed25519", "ED25519"), ("rsa", "RSA")):
        priv, pub = ec_key(d, kind, kind)
        expect(tc("sign", s["cask"], "--private-key", priv, "--signature", f"{d}/{kind}.sig"), UNSUPPORTED,
               err_contains=name)
        expect(tc("verify", s["cask"], "--signature", s["sig"], "--public-key", pub), SIGNATURE,
               err_contains=f"unsupported key type {name}")
    expect(tc("sign", s["cask"], "--private-key", f"{d}/none.pem"), NOT_FOUND)


def test_signed_directory_with_a_file_swapped_for_another_steps(d):
    """A directory is signed as model_signing's directory model; a file swapped for another's is named."""
    rng = np.random.default_rng(7)
    os.makedirs(f"{d}/step_1")
    os.makedirs(f"{d}/step_2")
    for step in (1, 2):
        for name in ("a", "b"):
            src = f"{d}/{name}{step}.safetensors"
            save_file({"w": rng.standard_normal(5000).astype(np.float32)}, src)
            expect(tc("import", src, f"{d}/step_{step}/{name}.cask"), OK)
    priv, pub = ec_key(d, "key")
    expect(tc("sign", f"{d}/step_1", "--private-key", priv, "--shard-size", 4096), OK,
           out_contains=f"wrote {d}/step_1.sig")
    expect(tc("verify", f"{d}/step_1/a.cask", "--signature", f"{d}/step_1.sig", "--public-key", pub), OK)
    with open(f"{d}/step_2/b.cask", "rb") as f:
        open(f"{d}/step_1/b.cask", "wb").write(f.read())
    expect(tc("verify", f"{d}/step_1/b.cask", "--signature", f"{d}/step_1.sig", "--public-key", pub), SIGNATURE,
           err_contains="'b.cask:")
    expect(tc("verify", f"{d}/step_1/a.cask", "--signature", f"{d}/step_1.sig", "--public-key", pub), OK)


def test_model_signing_interop_both_ways(signed, d):
    """`model_signing verify key` accepts treecask's bundle (files: its CLI hashes by files), and
    treecask accepts what `model_signing sign key` writes."""
    ms = pytest.importorskip("model_signing")
    import shutil
    cli = shutil.which("model_signing") or os.path.join(os.path.dirname(os.path.realpath(ms.__file__)),
                                                        "..", "..", "..", "..", "bin", "model_signing")
    if not os.path.exists(cli):
        pytest.skip("the model_signing command is not installed")
    s = signed
    expect(tc("sign", s["cask"], "--private-key", s["priv"], "--files", "--signature", f"{d}/files.sig"), OK)
    r = subprocess.run([cli, "verify", "key", "--signature", f"{d}/files.sig", "--public_key", s["pub"], s["cask"]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Verification succeeded" in r.stdout, r
    r = subprocess.run([cli, "sign", "key", "--private_key", s["priv"], "--signature", f"{d}/ms.sig", s["cask"]],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r
    expect(tc("verify", s["cask"], "--signature", f"{d}/ms.sig", "--public-key", s["pub"]), OK)
    expect(tc("get", s["cask"], "small", "-o", f"{d}/s.npy", "--signature", f"{d}/ms.sig", "--public-key", s["pub"]), OK)
