"""Round trips, dtypes, containers, errors: NumPy only (no jax needed)."""

import collections
import os
import pickle
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import treecask
from treecask import _dtypes
from conftest import bits, trees_equal

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
    "float8_e4m3fn", "float8_e5m2", "int4", "uint4",
    # format 4.0
    "float4_e2m1fn", "float6_e2m3fn", "float6_e3m2fn", "float8_e8m0fnu", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "int2", "uint2", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz",
]
NEW_IN_4 = set(DTYPES[19:])


def np_dtype(name):
    return np.dtype(getattr(ml_dtypes, name, None) or name)


def sample(name, shape, rng):
    dt = np_dtype(name)
    n = int(np.prod(shape))
    if name == "bool":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if name in _dtypes.BITS:  # packed sub-byte dtypes: every bit pattern, one element per byte
        return rng.integers(0, 1 << _dtypes.BITS[name], n, dtype=np.uint8).view(dt).reshape(shape)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True).reshape(shape)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt).reshape(shape)
    return rng.standard_normal(n).astype(dt).reshape(shape)


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips(cask, name):
    rng = np.random.default_rng(0)
    tree = {s: sample(name, shape, rng) for s, shape in
            [("scalar", ()), ("empty", (0,)), ("odd", (7,)), ("matrix", (3, 5))]}
    treecask.save(cask, tree, durable=False)
    back = treecask.load(cask)
    assert trees_equal(back, tree)
    with treecask.open(cask) as a:
        info = a.info("matrix")
        assert info.dtype == np_dtype(name) and info.dtype_name == name and info.shape == (3, 5)
        assert info.byte_length == (15 * _dtypes.BITS.get(name, 8 * np_dtype(name).itemsize) + 7) // 8
        assert np.array_equal(bits(a["matrix"]), bits(tree["matrix"]))
        assert np.array_equal(bits(a.read("odd")), bits(tree["odd"]))
        assert np.array_equal(bits(a.read_rows("matrix", 1, 3)), bits(tree["matrix"][1:3]))
        assert np.array_equal(bits(a.read_slice("matrix", (slice(1, 3), slice(1, 4)))),
                              bits(tree["matrix"][1:3, 1:4]))
        # The writer writes format 4.0 only for the dtypes 4.0 added (SPEC.md "Versioning").
        assert a.format_version == ((4, 0) if name in NEW_IN_4 else (1, 0))


def test_sub_byte_dtypes_pack_as_the_spec_says(cask):
    """SPEC.md "Dtypes": element k at bits [k*bits, (k+1)*bits) of the
    little-endian bit stream, padding bits zero; ml_dtypes holds the value in
    the low bits of one byte."""
    x2 = np.array([1, -2, -1, 0, 1], ml_dtypes.int2)          # 2-bit: 01 10 11 00 | 01
    f4 = np.array([0.5, -6.0, 3.0], ml_dtypes.float4_e2m1fn)  # 0x1, 0xF, 0x5
    f6 = np.array([1.0, -0.5, 7.5, 0.125, 2.0], ml_dtypes.float6_e2m3fn)
    treecask.save(cask, {"x2": x2, "f4": f4, "f6": f6}, durable=False, compression="none")
    with treecask.open(cask) as a:
        assert a.format_version == (4, 0)
        raw = {k: bytes(a._c().view(a._index(k))) for k in ("x2", "f4", "f6")}
        assert raw["x2"] == bytes([0b00111001, 0b01])
        assert raw["f4"] == bytes([0x1 | 0xF << 4, 0x5])
        codes = [int(c) for c in f6.view(np.uint8)]
        stream = sum(c << (6 * k) for k, c in enumerate(codes))
        assert raw["f6"] == stream.to_bytes(4, "little")  # 30 bits -> 4 bytes, 2 padding bits zero
        for k, want in (("x2", x2), ("f4", f4), ("f6", f6)):
            got = a[k]
            assert got.dtype == want.dtype and np.array_equal(bits(got), bits(want))


def test_int4_is_packed_two_per_byte_low_nibble_first(cask):
    x = np.array([1, -2, 3], dtype=ml_dtypes.int4)
    treecask.save(cask, x, durable=False, compression="none")
    with treecask.open(cask) as a:
        info = a.info("")
        assert info.byte_length == 2
        raw = a._c().view(0)  # the file's bytes
        assert list(raw) == [0x1 | (0xE << 4), 0x3]
        assert np.array_equal(a[""].astype(np.int8), [1, -2, 3])


def test_python_scalars_strings_and_none(cask):
    tree = {"i": 3, "big": -(2**63), "f": 0.25, "b": True, "c": 1 + 2j, "s": "héllo/wörld", "e": "",
            "n": None, "np": np.float32(1.5)}
    treecask.save(cask, tree, durable=False)
    back = treecask.load(cask)
    for k in ("i", "big", "f", "b", "s", "e", "n"):
        assert type(back[k]) is type(tree[k]) and back[k] == tree[k]
    assert back["c"] == tree["c"] and back["np"].dtype == np.float32
    with treecask.open(cask) as a:
        assert a.info("i").value_kind == "int" and a.info("i").dtype_name == "int64"
        assert a.info("s").value_kind == "str" and a.info("s").dtype_name == "uint8"
        assert bytes(a["s"]).decode() == "héllo/wörld"
        assert "n" not in a and [n.kind for n in a.treedef].count("none") == 1


def test_containers_and_namedtuples(cask):
    Point = collections.namedtuple("Point", "x y")
    tree = {"list": [np.ones(2), (np.zeros(1), 2)], "pt": Point(np.arange(3), None), "empty": {}, "t": ()}
    treecask.save(cask, tree, durable=False)
    with treecask.open(cask) as a:
        assert a.keys() == ["list/0", "list/1/0", "list/1/1", "pt/x"]
        kinds = {n.kind: n for n in a.treedef}
        assert kinds["namedtuple"].type_name.endswith("Point") and kinds["namedtuple"].keys == ("x", "y")
    plain = treecask.load(cask)
    assert plain["pt"].keys() == {"x", "y"} and plain["pt"]["y"] is None  # no like: a dict
    assert isinstance(plain["list"][1], tuple) and plain["empty"] == {} and plain["t"] == ()
    back = treecask.load(cask, like=tree)
    assert type(back["pt"]) is Point and np.array_equal(back["pt"].x, np.arange(3))


def test_key_paths_are_escaped(cask):
    tree = {"a/b": np.ones(1), "c~d": {"e": np.zeros(1)}, "0": [np.ones(2)]}
    treecask.save(cask, tree, durable=False)
    with treecask.open(cask) as a:
        assert sorted(a.keys()) == ["0/0", "a~1b", "c~0d/e"]
        assert np.array_equal(a["a~1b"], np.ones(1))
    assert trees_equal(treecask.load(cask), tree)
    assert trees_equal(treecask.load(cask, subtree="c~0d"), {"e": np.zeros(1)})


def test_key_path_escapes_are_the_cores(cask):
    """A key path is split by the core's own rule (SPEC.md "Key paths"): a "~"
    not followed by 0 or 1 is an InvalidArgumentError, for load(subtree=...) as
    for the C++ API, naming the file and the key path."""
    treecask.save(cask, {"a~b": {"c": np.ones(1)}}, durable=False)
    for bad in ("a~b", "a~2b/c", "x~"):
        with pytest.raises(treecask.InvalidArgumentError) as e:
            treecask.load(cask, subtree=bad)
        assert e.value.file == str(cask) and e.value.key_path == bad and "RFC 6901" in str(e.value)
    assert np.array_equal(treecask.load(cask, subtree="a~0b/c"), np.ones(1))


def test_the_dtype_table_is_the_cores():
    """_dtypes names exactly the core's dtypes, and its packed ones and their
    widths are the core's (treecask::dtype_packed, dtype_bits), so a leaf's
    byte length is what the core computes (byte_length_for)."""
    from treecask import _core

    assert sorted(_dtypes._NAME_TO_DTYPE) == sorted(_core.dtype_names()) == sorted(DTYPES)
    packed_bits = {"int2": 2, "uint2": 2, "int4": 4, "uint4": 4, "float4_e2m1fn": 4, "float6_e2m3fn": 6,
                   "float6_e3m2fn": 6}  # SPEC.md "Dtypes"
    assert _dtypes.PACKED == set(packed_bits) and _dtypes.BITS == packed_bits
    for name in DTYPES:
        bits = packed_bits.get(name, 8 * _dtypes.to_numpy(name).itemsize)
        assert _core.dtype_bits(name) == bits, name
        assert _core.byte_length_for(name, [3, 5]) == (15 * bits + 7) // 8, name
    with pytest.raises(treecask.InvalidArgumentError):
        _core.dtype_bits("int3")


def test_archive_metadata_and_facts(cask):
    stats = treecask.save(cask, {"w": np.ones(4, np.float32)}, metadata={"step": "10", "run": "x"},
                          durable=False)
    assert stats.num_leaves == 1 and stats.raw_bytes == 16 and stats.file_bytes == os.path.getsize(cask)
    with treecask.open(cask) as a:
        assert a.metadata == {"step": "10", "run": "x"}
        # No filter: written as 1.0 so that 1.x readers read it; FORMAT_VERSION is
        # the newest this library reads and writes.
        assert a.format_version == (1, 0) and treecask.FORMAT_VERSION == (4, 1)
        assert a.library_version == treecask.library_version()
        assert a.file_size == os.path.getsize(cask) and len(a) == 1 and list(a) == ["w"]
        assert a.created_unix_ns > 0
    with pytest.raises(treecask.InvalidArgumentError):
        treecask.save(cask, {}, metadata={"k": 1}, overwrite=True)


def test_lz4_leaves_are_read_into_fresh_arrays(cask):
    x = np.zeros((512, 512), np.float32)
    x[::7] = 1.0
    treecask.save(cask, {"x": x, "noise": np.random.default_rng(0).standard_normal(4096)},
                  compression="auto", durable=False)
    with treecask.open(cask) as a:
        assert a.info("x").codec == "lz4" and a.info("x").stored_bytes < x.nbytes // 4
        assert not a.info("x").zero_copy
        assert a.info("noise").codec == "none" and a.info("noise").zero_copy
        v = a["x"]
        assert not v.flags.writeable and np.array_equal(v, x)
        assert np.array_equal(a.read_rows("x", 100, 300), x[100:300])
    treecask.save(cask, {"x": x}, compression="lz4", overwrite=True, durable=False)
    assert treecask.open(cask).info("x").codec == "lz4"
    treecask.save(cask, {"x": x}, compression="none", overwrite=True, durable=False)
    assert treecask.open(cask).info("x").codec == "none"
    with pytest.raises(treecask.InvalidArgumentError):
        treecask.save(cask, {"x": x}, compression="zstd", overwrite=True)


def test_multi_chunk_multi_part_leaf(cask):
    x = np.random.default_rng(1).standard_normal((100, 1000)).astype(np.float32)  # 400 KB
    treecask.save(cask, {"x": x}, compression="none", chunk_size=4096, max_part_bytes=64 * 4096,
                  durable=False)
    with treecask.open(cask) as a:
        info = a.info("x")
        assert info.num_chunks == -(-x.nbytes // 4096) and info.num_parts == 2
        assert not info.zero_copy
        assert np.array_equal(a["x"], x)
        assert np.array_equal(a.read_rows("x", 63, 67), x[63:67])  # across the part boundary
        assert np.array_equal(a.read_rows("x", 5, 5), x[5:5])
        with pytest.raises(treecask.InvalidArgumentError):
            a.read_rows("x", 50, 101)
    assert np.array_equal(treecask.load(cask)["x"], x)


def test_views_stay_valid_after_close(cask):
    x = np.arange(1000, dtype=np.int64)
    treecask.save(cask, {"x": x}, compression="none", durable=False)
    a = treecask.open(cask)
    v = a["x"]
    a.close()
    assert a.closed
    del a
    assert np.array_equal(v, x)
    with pytest.raises(ValueError):
        v[0] = 1  # read-only


def test_closed_archive_raises(cask):
    treecask.save(cask, {"x": np.ones(1)}, durable=False)
    with treecask.open(cask) as a:
        pass
    with pytest.raises(treecask.Error):
        a["x"]


# ---- errors -------------------------------------------------------------------------


def test_not_found_and_already_exists(cask):
    with pytest.raises(treecask.NotFoundError) as e:
        treecask.load(cask)
    assert isinstance(e.value, FileNotFoundError) and e.value.file == str(cask)
    assert e.value.code == 1 and str(cask) in str(e.value)
    treecask.save(cask, {"x": np.ones(1)}, durable=False)
    with pytest.raises(treecask.AlreadyExistsError) as e:
        treecask.save(cask, {"x": np.ones(2)})
    assert isinstance(e.value, FileExistsError)
    treecask.save(cask, {"x": np.ones(2)}, overwrite=True, durable=False)
    assert treecask.load(cask)["x"].shape == (2,)
    assert not [p for p in os.listdir(cask.parent) if ".tmp." in p]


def test_not_an_archive(tmp_path):
    p = tmp_path / "junk.cask"
    p.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 64)
    with pytest.raises(treecask.NotAnArchiveError) as e:
        treecask.open(p)
    assert e.value.file == str(p)


def test_truncated_file_is_corruption(cask, tmp_path):
    treecask.save(cask, {"x": np.random.default_rng(0).standard_normal(100000)}, durable=False)
    data = cask.read_bytes()
    bad = tmp_path / "cut.cask"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises((treecask.CorruptionError, treecask.NotAnArchiveError)):
        treecask.load(bad)


def test_flipped_byte_is_a_checksum_error(cask, tmp_path):
    from conftest import file_offset_of

    x = np.random.default_rng(0).standard_normal(50000)
    treecask.save(cask, {"x": x, "y": np.ones(10)}, compression="none", durable=False)
    with treecask.open(cask) as a:
        off = file_offset_of(a["x"], cask) + 12345
    data = bytearray(cask.read_bytes())
    data[off] ^= 0x40
    bad = tmp_path / "bad.cask"
    bad.write_bytes(bytes(data))
    with treecask.open(bad) as a:
        errs = a.verify()
        assert len(errs) == 1 and isinstance(errs[0], treecask.ChecksumError)
        assert errs[0].key_path == "x" and errs[0].file == str(bad)
        with pytest.raises(treecask.ChecksumError) as e:
            a["x"]
        assert isinstance(e.value, treecask.CorruptionError) and e.value.key_path == "x"
        assert np.array_equal(a["y"], np.ones(10))  # other leaves still readable
    with pytest.raises(treecask.ChecksumError):
        treecask.load(bad)
    assert treecask.load(bad, subtree="y").shape == (10,)
    with treecask.open(bad, verify_checksums=False) as a:
        assert a["x"][0] == x[0]  # trusted fast path reads without checking
    with treecask.open(cask) as a:
        assert a.verify() == []


def test_bad_bytes_are_value_errors(cask, tmp_path):
    """An empty, a truncated and a bit-flipped file all raise a ValueError
    (NotAnArchiveError, CorruptionError, ChecksumError: errors.py), so that
    ``except ValueError`` catches every file whose bytes are wrong; none is an
    OSError (the OS refused nothing)."""
    x = np.random.default_rng(1).standard_normal(50000)
    treecask.save(cask, {"x": x}, compression="none", durable=False)
    data = cask.read_bytes()
    with treecask.open(cask) as a:
        from conftest import file_offset_of

        off = file_offset_of(a["x"], cask) + 100
    flipped = bytearray(data)
    flipped[off] ^= 0x01
    cases = {"empty.cask": (b"", treecask.NotAnArchiveError),
             "cut.cask": (data[: len(data) - 4096], treecask.CorruptionError),
             "flipped.cask": (bytes(flipped), treecask.ChecksumError)}
    for name, (content, cls) in cases.items():
        p = tmp_path / name
        p.write_bytes(content)
        try:
            treecask.load(p)
        except ValueError as e:
            assert isinstance(e, cls) and not isinstance(e, OSError), (name, type(e))
            assert e.file == str(p)
        else:
            raise AssertionError(f"{name} loaded")
    for cls in (treecask.CorruptionError, treecask.ChecksumError, treecask.NotAnArchiveError):
        assert issubclass(cls, ValueError) and not issubclass(cls, OSError)


def test_bad_leaves_name_their_key_path(cask):
    with pytest.raises(treecask.InvalidArgumentError) as e:
        treecask.save(cask, {"a": {"b": object()}})
    assert e.value.key_path == "a/b" and e.value.file == str(cask)
    with pytest.raises(treecask.InvalidArgumentError) as e:
        treecask.save(cask, {"n": 2**70})
    assert e.value.key_path == "n"
    with pytest.raises(treecask.InvalidArgumentError) as e:
        treecask.save(cask, {"s": np.array(["x"])})
    assert e.value.key_path == "s"
    with pytest.raises(treecask.InvalidArgumentError):
        treecask.save(cask, {"": np.ones(1)})  # empty key
    assert not cask.exists()


def test_key_not_found(cask):
    treecask.save(cask, {"a": {"b": np.ones(1)}}, durable=False)
    with treecask.open(cask) as a:
        with pytest.raises(treecask.KeyNotFoundError) as e:
            a["a/c"]
        assert isinstance(e.value, KeyError) and e.value.key_path == "a/c" and "a/c" in str(e.value)
        assert "a/b" in a and "a/c" not in a and "a" not in a
    with pytest.raises(treecask.KeyNotFoundError) as e:
        treecask.load(cask, subtree="a/x")
    assert e.value.key_path == "a/x"


def test_errors_pickle_and_keep_attributes():
    e = treecask.ShapeError("bad", file="f.cask", key_path="a/b")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is treecask.ShapeError and e2.file == "f.cask" and e2.key_path == "a/b"
    assert str(e2) == "f.cask: a/b: shape mismatch: bad"
    assert issubclass(treecask.ChecksumError, treecask.CorruptionError)
    for cls in (treecask.NotFoundError, treecask.StructureError, treecask.VersionError, treecask.IoError):
        assert issubclass(cls, treecask.Error)


def test_every_core_error_code_has_its_class():
    """treecask.errors has one class per C++ ErrorCode, with the core's number and name: the
    stable codes of include/treecask/error.h, which the CLI's exit status also follows."""
    from treecask import _core, errors

    stable = {"not found": 1, "not an archive": 2, "unsupported version": 3, "corruption": 4,
              "checksum mismatch": 5, "key not found": 6, "invalid argument": 7, "shape mismatch": 8,
              "I/O error": 9, "already exists": 10, "unsupported": 11, "signature": 12}
    assert _core.ERROR_CODES == stable
    assert {cls.code_name: cls.code for cls in errors._BY_CODE.values()} == stable
    assert errors.NotFoundError.code == 1 and errors.SignatureError.code == 12


# ---- templates (like) without jax ------------------------------------------------------


def test_like_restores_types_and_checks_shapes(cask):
    Point = collections.namedtuple("Point", "x y")
    tree = {"p": Point(np.arange(3.0), 7), "s": "name", "f": 1.5}
    treecask.save(cask, tree, durable=False)
    like = {"p": Point(np.zeros(3), 0), "s": "", "f": 0.0}
    back = treecask.load(cask, like=like)
    assert type(back["p"]) is Point and back["p"].y == 7 and back["s"] == "name" and back["f"] == 1.5
    with pytest.raises(treecask.ShapeError) as e:
        treecask.load(cask, like={"p": Point(np.zeros(4), 0)})
    assert e.value.key_path == "p/x" and "float64[4]" in str(e.value) and "float64[3]" in str(e.value)
    with pytest.raises(treecask.ShapeError) as e:
        treecask.load(cask, like={"p": Point(np.zeros(3, np.float32), 0)})
    assert e.value.key_path == "p/x"
    with pytest.raises(treecask.ShapeError):
        treecask.load(cask, like={"s": 3})


def test_like_missing_and_extra(cask):
    treecask.save(cask, {"a": np.ones(2), "b": np.zeros(2)}, durable=False)
    with pytest.raises(treecask.StructureError) as e:
        treecask.load(cask, like={"a": np.ones(2), "c": np.ones(3)})
    assert e.value.key_path == "c" and e.value.file == str(cask)
    back = treecask.load(cask, like={"a": np.zeros(2), "c": np.full(3, 5.0)}, missing="from_like")
    assert np.array_equal(back["a"], np.ones(2)) and np.array_equal(back["c"], np.full(3, 5.0))
    assert treecask.load(cask, like={"a": np.zeros(2)}).keys() == {"a"}  # extra ignored
    with pytest.raises(treecask.StructureError) as e:
        treecask.load(cask, like={"a": np.zeros(2)}, extra="error")
    assert e.value.key_path == "b"
    with pytest.raises(treecask.InvalidArgumentError):
        treecask.load(cask, like={"a": np.zeros(2)}, missing="zero")


# ---- property test ------------------------------------------------------------------------

_leaf = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=8),
    st.none(),
    st.builds(lambda name, n, seed: sample(name, (n,), np.random.default_rng(seed)),
              st.sampled_from(DTYPES), st.integers(0, 9), st.integers(0, 99)),
)
_key = st.text(min_size=1, max_size=6).filter(lambda s: "\x00" not in s)
_tree = st.recursive(
    _leaf,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.lists(kids, max_size=3).map(tuple),
                           st.dictionaries(_key, kids, max_size=4)),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tree=_tree)
def test_random_trees_round_trip(tmp_path, tree):
    p = tmp_path / "h.cask"
    treecask.save(p, tree, overwrite=True, durable=False)
    assert trees_equal(treecask.load(p), tree)
    assert trees_equal(treecask.load(p, like=tree), tree)


def test_works_without_jax(tmp_path):
    """With jax unimportable, dict/list/tuple/namedtuple trees still round-trip."""
    code = textwrap.dedent(f"""
        import sys, collections
        sys.modules["jax"] = None
        import numpy as np, treecask
        P = collections.namedtuple("P", "a b")
        t = {{"x": [np.arange(3), (1.5, "s")], "p": P(np.ones(2), None)}}
        treecask.save({str(tmp_path / 'nj.cask')!r}, t, durable=False)
        back = treecask.load({str(tmp_path / 'nj.cask')!r}, like=t)
        assert type(back["p"]) is P and back["x"][1] == (1.5, "s")
        assert "jax" not in [m for m in sys.modules if sys.modules[m] is not None and m == "jax"]
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.parametrize("tree", [None, {}, [], (), {"a": None}, np.float32(2.0), 5, "root"],
                         ids=lambda t: type(t).__name__)
def test_degenerate_trees(cask, tree):
    treecask.save(cask, tree, durable=False)
    back = treecask.load(cask)
    assert trees_equal(back, tree) if not isinstance(tree, np.generic) else back == tree
    with treecask.open(cask) as a:
        assert a.keys() == ([""] if tree is not None and not isinstance(tree, (dict, list, tuple)) else [])


def test_python_scalar_restores_into_0d_arrays(cask):
    treecask.save(cask, {"step": 5, "lr": 0.5, "flag": True}, durable=False)
    like = {"step": np.zeros((), np.int32), "lr": np.float32(0), "flag": np.zeros((), bool)}
    back = treecask.load(cask, like=like)
    assert back["step"].dtype == np.int32 and back["step"] == 5
    assert type(back["lr"]) is np.float32 and back["lr"] == 0.5
    with pytest.raises(treecask.ShapeError):
        treecask.load(cask, like={"step": np.zeros((), np.float32)})


# Every low-precision and packed dtype of format 4.0 (SPEC.md "Dtypes"), with a value each holds exactly.
_LOW_PRECISION = [("int2", 1), ("uint2", 3), ("int4", -7), ("uint4", 9), ("float4_e2m1fn", 1.5),
                  ("float6_e2m3fn", 1.5), ("float6_e3m2fn", 1.5), ("float8_e3m4", 1.5), ("float8_e4m3", 1.5),
                  ("float8_e4m3fn", 1.5), ("float8_e4m3fnuz", 1.5), ("float8_e4m3b11fnuz", 1.5),
                  ("float8_e5m2", 1.5), ("float8_e5m2fnuz", 1.5), ("float8_e8m0fnu", 2.0)]


@pytest.mark.parametrize("name,value", _LOW_PRECISION, ids=[n for n, _ in _LOW_PRECISION])
def test_python_scalar_templates_take_every_low_precision_dtype(cask, name, value):
    # A 0-d leaf of any integer or floating dtype restores into a Python int / float template,
    # and a Python scalar in the file into a 0-d array of that dtype, as for float32 and int32.
    dtype = np.dtype(getattr(ml_dtypes, name))
    treecask.save(cask, {"x": np.array(value, dtype), "y": value}, durable=False)
    back = treecask.load(cask, like={"x": type(value)(0), "y": np.zeros((), dtype)})
    assert type(back["x"]) is type(value) and back["x"] == value
    assert back["y"].dtype == dtype and back["y"].shape == () and float(back["y"]) == value
    wrong = 0.0 if isinstance(value, int) else 0
    with pytest.raises(treecask.ShapeError, match="the template expects an? (int|float)"):
        treecask.load(cask, like={"x": wrong, "y": np.zeros((), dtype)})


def test_save_into_missing_directory_is_an_error(tmp_path):
    with pytest.raises(treecask.Error) as e:
        treecask.save(tmp_path / "no" / "such" / "dir.cask", {"x": np.ones(1)})
    assert isinstance(e.value, (treecask.IoError, treecask.NotFoundError))


def test_dict_and_list_subclasses(cask):
    class Config(dict):
        pass

    class Layers(list):
        pass

    od = collections.OrderedDict([("z", np.ones(1)), ("a", np.zeros(1))])
    tree = {"cfg": Config(lr=np.float64(0.1)), "layers": Layers([np.ones(2)]), "od": od}
    treecask.save(cask, tree, durable=False)
    plain = treecask.load(cask)
    assert type(plain["cfg"]) is dict and type(plain["layers"]) is list
    back = treecask.load(cask, like=tree)
    assert type(back["cfg"]) is Config and type(back["layers"]) is Layers
    assert type(back["od"]) is collections.OrderedDict and list(back["od"]) == ["z", "a"]


def test_a_template_subclass_that_cannot_be_rebuilt_is_restored_as_its_base_with_a_warning(cask):
    class Named(dict):  # its constructor wants a name first: cannot be built from pairs
        def __init__(self, name, *args):
            super().__init__(*args)
            self.name = name

    class Pair(tuple):
        def __new__(cls, a, b):
            return super().__new__(cls, (a, b))

    tree = {"cfg": Named("run", {"lr": np.float64(0.1)}), "pair": Pair(np.ones(2), np.zeros(2))}
    treecask.save(cask, tree, durable=False)
    with pytest.warns(UserWarning) as got:
        back = treecask.load(cask, like=tree)
    said = [str(w.message) for w in got]
    assert any(m.startswith("cfg: ") and "Named" in m and "restored as a dict" in m for m in said), said
    assert any(m.startswith("pair: ") and "Pair" in m and "restored as a tuple" in m for m in said), said
    assert type(back["cfg"]) is dict and back["cfg"] == {"lr": 0.1}
    assert type(back["pair"]) is tuple and np.array_equal(back["pair"][0], np.ones(2))


def test_shuffle_compresses_float_weights_and_writes_format_2(tmp_path):
    rng = np.random.default_rng(0)
    tree = {"w": (rng.standard_normal((256, 512)) * 0.02).astype(ml_dtypes.bfloat16),
            "v": rng.standard_normal(40000).astype(np.float32),
            "mask": np.ones(5000, np.uint8), "step": 7}
    plain, shuf = tmp_path / "plain.cask", tmp_path / "shuf.cask"
    treecask.save(plain, tree, compression="lz4", durable=False)
    treecask.save(shuf, tree, compression="lz4", shuffle=True, durable=False)
    with treecask.open(plain) as a, treecask.open(shuf) as b:
        assert a.format_version == (1, 0) and b.format_version == (2, 0)
        assert [b.info(k).filter for k in ("w", "v", "mask")] == ["shuffle", "shuffle", "none"]
        assert a.info("w").filter == "none"
        # bf16 weights: LZ4 alone finds little; shuffled, the sign/exponent plane compresses.
        assert b.info("w").stored_bytes < 0.85 * a.info("w").stored_bytes
        assert np.array_equal(b["w"].view(np.uint16), tree["w"].view(np.uint16))
    assert trees_equal(treecask.load(shuf), treecask.load(plain))
    back = treecask.load(shuf, subtree="v")
    assert np.array_equal(back, tree["v"])


def test_sharded_golden_vector_lists_its_boxes():
    """format/vectors/v3_0_sharded (format 3.0): each leaf's info lists the saved boxes
    (ShardBox), none is a view of a map, and each global array is its boxes, read from the
    shard files they name, put in place."""
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "format", "vectors", "v3_0_sharded")
    with treecask.open(d) as c:
        assert isinstance(c, treecask.ShardedArchive)
        w = c.info("params/w")
        assert w.shape == (6, 8) and len(w.shards) == 4 and not w.zero_copy
        assert {b.file for b in w.shards} == {"process_0.cask", "process_1.cask"}
        for k in c.keys():
            info = c.info(k)
            arr = c[k]
            assert arr.flags.owndata and not arr.flags.writeable and not info.zero_copy
            expect = np.zeros(info.shape, info.dtype)
            for b in info.shards:
                with treecask.open(os.path.join(d, b.file)) as shard:
                    expect[tuple(slice(s, e) for s, e in zip(b.start, b.stop))] = shard[b.key_path]
            np.testing.assert_array_equal(arr, expect)
        assert treecask.open(os.path.join(d, "process_0.cask")).info(w.shards[0].key_path).shards == ()
        # Row and slice reads of the global array, and their argument errors, as an Archive's.
        np.testing.assert_array_equal(c.read_rows("params/w", 2, 5), c["params/w"][2:5])
        np.testing.assert_array_equal(c.read_slice("params/w", (slice(1, 4), -1)), c["params/w"][1:4, -1])
        for bad in (lambda: c.read_rows("params/w", 4, 2), lambda: c.read_rows("params/w", 0, 7),
                    lambda: c.read_slice("params/w", (slice(0, 6, 2),))):
            with pytest.raises(treecask.InvalidArgumentError):
                bad()
    for closed in (lambda: c.read("params/w"), lambda: c.read_rows("params/w", 0, 1),
                   lambda: c.read_slice("params/w", 0)):
        with pytest.raises(treecask.InvalidArgumentError, match="closed"):
            closed()
    # load(copy=False) of a sharded checkpoint: no leaf is a view of a map, so each comes as a
    # fresh read-only array, equal to what load() assembles.
    def arrays(tree, path=""):
        if isinstance(tree, dict):
            return {k: v for key, sub in tree.items() for k, v in arrays(sub, f"{path}/{key}").items()}
        if isinstance(tree, (list, tuple)):
            return {k: v for n, sub in enumerate(tree) for k, v in arrays(sub, f"{path}/{n}").items()}
        return {path: tree} if isinstance(tree, np.ndarray) else {}

    flat_views, flat_copies = arrays(treecask.load(d, copy=False)), arrays(treecask.load(d))
    assert flat_views.keys() == flat_copies.keys() and flat_views
    for k, arr in flat_views.items():
        assert arr.flags.owndata and not arr.flags.writeable, k
        np.testing.assert_array_equal(arr, flat_copies[k])
