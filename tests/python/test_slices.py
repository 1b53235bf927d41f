"""N-d slice reads (the core reads N-d slices): Archive.read_slice
and the core's read_slice / read_slices / read_bytes against NumPy slicing, for
every dtype, codec, the shuffle filter and multi-part leaves, with hypothesis
generating shapes and indices; strided destinations; damage and bad indices;
sharded restore placing each device's box."""

from __future__ import annotations

import os

import jax
import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import treecask
from treecask import _dtypes
from treecask.errors import ChecksumError, InvalidArgumentError, ShapeError

DTYPES = sorted(_dtypes._NAME_TO_DTYPE)  # every dtype the format has
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _values(name: str, shape, seed: int, smooth: bool) -> np.ndarray:
    """An array of dtype `name`: random bytes, or (smooth) few distinct values
    so that LZ4 really compresses its chunks."""
    rng = np.random.default_rng(seed)
    dt = _dtypes.to_numpy(name)
    n = int(np.prod(shape, dtype=np.int64))
    if name == "bool":
        return (rng.random(n) < 0.5).reshape(shape)
    if name in _dtypes.BITS:  # packed sub-byte dtypes: the value in the low bits of each byte
        hi = 1 << _dtypes.BITS[name]
        v = rng.integers(0, hi, n) if not smooth else (np.arange(n) // 7) % hi
        return v.astype(np.uint8).view(dt).reshape(shape)
    if smooth:
        return ((np.arange(n) // 5) % 4).astype(np.float32).astype(dt).reshape(shape)
    raw = rng.integers(0, 256, n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal dtype, shape and bytes (NaN payloads included)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@st.composite
def shapes(draw):
    rank = draw(st.integers(0, 4))
    dims = [draw(st.integers(0, 9)) for _ in range(rank)]
    if rank and draw(st.booleans()):  # a long first axis: many 4 KiB chunks
        dims[0] = draw(st.integers(100, 700))
    return tuple(dims)


@st.composite
def basic_index(draw, shape):
    """A NumPy basic index over `shape`: ints, step-1 slices (bounds may lie
    outside, be negative or None), maybe one Ellipsis, maybe fewer entries."""
    items = []
    for n in shape:
        if n > 0 and draw(st.integers(0, 4)) == 0:
            items.append(draw(st.integers(-n, n - 1)))
        else:
            b = st.one_of(st.none(), st.integers(-n - 2, n + 2))
            items.append(slice(draw(b), draw(b)))
    k = draw(st.integers(0, len(items)))
    if draw(st.booleans()):
        items = items[:k]
    elif items and draw(st.booleans()):
        j = draw(st.integers(0, k))
        items = items[:j] + [Ellipsis] + items[k:]
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


@st.composite
def cases(draw):
    shape = draw(shapes())
    name = draw(st.sampled_from(DTYPES))
    codec = draw(st.sampled_from(["none", "lz4"]))
    shuffle = codec == "lz4" and draw(st.booleans())
    parts = codec == "none" and draw(st.booleans())
    smooth = draw(st.booleans())
    seed = draw(st.integers(0, 2**31))
    indices = [draw(basic_index(shape)) for _ in range(3)]
    return shape, name, codec, shuffle, parts, smooth, seed, indices


@SETTINGS
@given(cases())
def test_read_slice_equals_numpy_slicing(tmp_path, case):
    shape, name, codec, shuffle, parts, smooth, seed, indices = case
    x = _values(name, shape, seed, smooth)
    path = tmp_path / "s.cask"
    treecask.save(path, {"x": x}, compression=codec, shuffle=shuffle, chunk_size=4096,
                  max_part_bytes=8192 if parts else None, overwrite=True, durable=False)
    with treecask.open(path) as a:
        info = a.info("x")
        assert info.codec == codec or info.byte_length == 0
        if parts and info.byte_length > 64 * 1024:  # smaller leaves are packed (SPEC.md "Packing small leaves")
            assert info.num_parts > 1
        for idx in indices:
            _same(a.read_slice("x", idx), x[idx])
        # The raw bytes, by ranges.
        raw = _dtypes.as_bytes(x, name)
        i = a._index("x")
        for lo, hi in ((0, len(raw)), (len(raw) // 3, len(raw) - len(raw) // 4)):
            out = np.empty(hi - lo, np.uint8)
            a._c().read_bytes(i, lo, out)
            assert out.tobytes() == raw[lo:hi].tobytes()


@SETTINGS
@given(shapes().filter(lambda s: len(s) >= 1), st.sampled_from(["float32", "bfloat16", "int4", "complex128", "uint8",
                                                                   "int2", "float4_e2m1fn", "float6_e3m2fn"]),
       st.sampled_from(["none", "lz4"]), st.integers(0, 2**31), st.data())
def test_read_slice_into_strided_views(tmp_path, shape, name, codec, seed, data):
    x = _values(name, shape, seed, smooth=codec == "lz4")
    path = tmp_path / "v.cask"
    treecask.save(path, {"x": x}, compression=codec, chunk_size=4096, overwrite=True, durable=False)
    idx = tuple(slice(*sorted((data.draw(st.integers(0, n)), data.draw(st.integers(0, n))))) for n in shape)
    want = x[idx]
    # A destination view: padded, reversed along some axes, axes permuted.
    perm = data.draw(st.permutations(range(len(shape))))
    flips = tuple(slice(None, None, -1) if data.draw(st.booleans()) else slice(None) for _ in shape)
    big = np.zeros(tuple(want.shape[p] + 3 for p in perm), want.dtype)
    view = big[tuple(slice(1, 1 + want.shape[p]) for p in perm)].transpose(np.argsort(perm))[flips]
    assert view.shape == want.shape
    with treecask.open(path) as a:
        a._c().read_slice(a._index("x"), [s.start for s in idx], [s.stop for s in idx], view)
    _same(view, want)
    # Bytes outside the view are untouched.
    mask = np.ones(big.shape, bool)
    mask[tuple(slice(1, 1 + want.shape[p]) for p in perm)] = False
    assert not big.view(np.uint8).reshape(big.shape + (-1,))[mask].any()


def test_int4_boxes_of_odd_rows_unpack(cask):
    """Rows of 7 nibbles start mid-byte; every box still reads (one byte per element)."""
    q = (np.arange(9 * 7) % 16 - 8).astype(ml_dtypes.int4).reshape(9, 7)
    treecask.save(cask, {"q": q}, durable=False)
    with treecask.open(cask) as a:
        for idx in [(slice(1, 4), slice(3, 6)), (5,), (slice(None), 6), (2, 3), (slice(8, 9),)]:
            _same(a.read_slice("q", idx), q[idx])
        _same(a.read_rows("q", 3, 6), q[3:6])


def test_bad_indices_raise_invalid_argument(cask):
    x = np.zeros((4, 5), np.float32)
    treecask.save(cask, {"x": x, "s": 1.5}, durable=False)
    with treecask.open(cask) as a:
        for idx in [(slice(0, 4, 2),), (4,), (0, -6), (0, 0, 0), (None,), ([1, 2],), (..., ...), ("a",)]:
            with pytest.raises(InvalidArgumentError) as e:
                a.read_slice("x", idx)
            assert e.value.key_path == "x" and e.value.file == str(cask)
        assert a.read_slice("s", ()) == 1.5
        i = a._index("x")
        with pytest.raises(InvalidArgumentError):  # stop beyond the dimension, in the core
            a._c().read_slice(i, [0, 0], [5, 5], np.empty(100, np.float32))
        with pytest.raises(ShapeError):  # wrong output size
            a._c().read_slice(i, [0, 0], [4, 5], np.empty(19, np.float32))
        with pytest.raises(ShapeError):  # a strided destination of another shape
            a._c().read_slice(i, [0, 0], [4, 5], np.empty((5, 4), np.float32).T[:3])
        with pytest.raises(InvalidArgumentError):
            a._c().read_bytes(i, 70, np.empty(11, np.uint8))


def test_a_damaged_chunk_fails_only_slices_that_touch_it(cask, tmp_path):
    rng = np.random.default_rng(5)
    x = rng.random((64, 256), dtype=np.float32)  # 4 rows per 4 KiB chunk
    treecask.save(cask, {"x": x}, compression="none", chunk_size=4096, durable=False)
    blob = bytearray(cask.read_bytes())
    at = bytes(blob).find(x[20:24].tobytes()[:64])  # chunk 5: rows 20..23
    assert at > 0
    blob[at + 999] ^= 0x10
    bad = tmp_path / "bad.cask"
    bad.write_bytes(bytes(blob))
    with treecask.open(bad) as a:
        with pytest.raises(ChecksumError) as e:
            a.read_slice("x", (slice(18, 21), slice(100, 101)))
        assert e.value.key_path == "x" and e.value.file == str(bad)
        _same(a.read_slice("x", (slice(0, 20), slice(3, 200))), x[0:20, 3:200])
        _same(a.read_slice("x", (slice(24, 64), 7)), x[24:64, 7])
    if len(jax.devices()) >= 8:
        mesh = jax.make_mesh((8, 1), ("x", "y"))
        with pytest.raises(ChecksumError):
            treecask.load(bad, shardings=NamedSharding(mesh, P(None, "x")))


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int4", "bool", "complex64"])
@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_sharded_restore_places_every_devices_box(cask, name, codec):
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    x = _values(name, (96, 40), 3, smooth=codec == "lz4")
    treecask.save(cask, {"w": x}, compression=codec, shuffle=codec == "lz4", chunk_size=4096, durable=False)
    for mesh_shape, spec in [((4, 2), P("x", None)), ((8, 1), P(None, "x")), ((4, 2), P("x", "y")),
                             ((1, 8), P("x", "y")), ((4, 2), P())]:
        mesh = jax.make_mesh(mesh_shape, ("x", "y"))
        s = NamedSharding(mesh, spec)
        out = treecask.load(cask, shardings=s)["w"]
        assert out.sharding == s and out.dtype == x.dtype
        for shard in out.addressable_shards:
            _same(np.asarray(shard.data), x[shard.index])
