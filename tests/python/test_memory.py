"""Zero-copy views and the memory cost of reading one leaf of a 1 GiB archive."""

import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import treecask
from conftest import data_address, mapping_of


def test_views_point_into_the_mapped_file(cask):
    x = np.random.default_rng(0).standard_normal((256, 300)).astype(np.float32)
    small = np.arange(10, dtype=np.int16)
    treecask.save(cask, {"x": x, "small": small}, compression="none", durable=False)
    with treecask.open(cask) as a:
        for key, ref in (("x", x), ("small", small)):
            v = a[key]
            assert a.info(key).zero_copy and not v.flags.writeable and not v.flags.owndata
            addr = data_address(v)
            lo, hi, _, path = mapping_of(addr)
            assert os.path.realpath(path) == os.path.realpath(cask), path
            assert lo <= addr and addr + v.nbytes <= hi
            assert addr % 64 == 0  # SPEC.md "Alignment"
            np.testing.assert_array_equal(v, ref)
        # A fresh copy does not point into the file.
        c = a.read("x")
        assert c.flags.writeable and mapping_of(data_address(c))[3] != os.path.realpath(cask)


_PROBE = textwrap.dedent("""
    import gc, sys
    import numpy as np
    import treecask

    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024

    path, key = sys.argv[1], sys.argv[2]
    # Warm up code paths on another leaf so one-time allocations do not count.
    with treecask.open(path) as a:
        np.asarray(a["big/0"][:1]).sum()
        treecask.load(path, subtree="big/1")
    gc.collect()

    a = treecask.open(path)
    base = rss()
    v = a[key]
    v.sum()  # touch every page of the view
    view_delta = rss() - base
    del v, a
    gc.collect()

    base = rss()
    x = treecask.load(path, subtree=key)
    x.sum()
    load_delta = rss() - base
    print(view_delta, load_delta, x.nbytes)
""")


@pytest.mark.slow
def test_reading_one_leaf_of_a_1gib_archive_costs_only_that_leaf(tmp_path):
    path = tmp_path / "big.cask"
    leaf = 8 << 20
    try:
        tree = {"big": [np.zeros(16 << 20, np.uint8) for _ in range(64)],  # 1 GiB of untouched zero pages
                "target": np.random.default_rng(0).integers(0, 255, leaf, dtype=np.uint8)}
        treecask.save(path, tree, compression="none", durable=False)
        del tree
        assert os.path.getsize(path) >= (1 << 30)
        r = subprocess.run([sys.executable, "-c", _PROBE, str(path), "target"], capture_output=True,
                           text=True, env=os.environ, timeout=300)
        assert r.returncode == 0, r.stderr
        view_delta, load_delta, nbytes = map(int, r.stdout.split())
        assert nbytes == leaf
        assert view_delta <= leaf + (1 << 20), view_delta
        assert load_delta <= leaf + (1 << 20), load_delta
    finally:
        path.unlink(missing_ok=True)


def _mixed_tree():
    rng = np.random.default_rng(1)
    return {
        "w": rng.standard_normal((300, 200)).astype(np.float32),  # raw, several chunks
        "small": np.arange(10, dtype=np.int16),                    # raw, packed with others
        "empty": np.zeros((3, 0), np.float32),
        "zeros": np.zeros(50_000, np.float32),                     # LZ4 under "auto"
        "parts": rng.integers(0, 255, 5 * 65536, dtype=np.uint8),  # two parts
        "q": np.arange(-8, 8, dtype=ml_dtypes.int4),               # packed nibbles
        "step": 7, "lr": 0.5, "name": "run-1", "nothing": None,
    }


def test_load_without_copy_views_the_map(cask):
    tree = _mixed_tree()
    treecask.save(cask, tree, compression="auto", chunk_size=65536, max_part_bytes=4 * 65536,
                  durable=False)
    with treecask.open(cask) as a:
        assert a.info("zeros").codec == "lz4" and a.info("parts").num_parts == 2
        arrays = {k for k, v in tree.items() if isinstance(v, np.ndarray)}
        assert {k for k in arrays if a.info(k).zero_copy} == {"w", "small", "empty"}
    got = treecask.load(cask, copy=False)
    want = treecask.load(cask)
    assert got.keys() == want.keys()
    file = os.path.realpath(cask)
    for k, ref in tree.items():
        v = got[k]
        if not isinstance(ref, np.ndarray):
            assert v == ref and type(v) is type(ref), k
            continue
        assert isinstance(v, np.ndarray) and v.dtype == ref.dtype and v.shape == ref.shape, k
        np.testing.assert_array_equal(v, ref)
        assert not v.flags.writeable, k
        in_map = v.nbytes > 0 and (mapping_of(data_address(v)) or (0, 0, 0, ""))[3] == file
        assert in_map == (k in ("w", "small")), k  # views of the map; copies for the others
    with pytest.raises(ValueError):
        got["w"][0, 0] = 1.0
    with pytest.raises(ValueError):
        got["zeros"][0] = 1.0
    sub = treecask.load(cask, subtree="w", copy=False)
    assert not sub.flags.writeable and mapping_of(data_address(sub))[3] == file


def test_load_without_copy_refuses_a_damaged_chunk(cask):
    x = np.random.default_rng(2).integers(0, 2**31, 100_000, dtype=np.int32)
    treecask.save(cask, {"a": np.ones(4, np.float32), "x": x}, compression="none", chunk_size=65536,
                  durable=False)
    data = bytearray(cask.read_bytes())
    at = data.find(x[-16:].tobytes())  # in x's last chunk
    assert at > 0
    data[at] ^= 1
    cask.write_bytes(bytes(data))
    with pytest.raises(treecask.errors.ChecksumError) as e:
        treecask.load(cask, copy=False)
    assert e.value.key_path == "x"
    np.testing.assert_array_equal(treecask.load(cask, subtree="a", copy=False), np.ones(4, np.float32))


def test_load_without_copy_takes_no_template(cask):
    treecask.save(cask, {"w": np.ones(3, np.float32)}, durable=False)
    with pytest.raises(treecask.errors.InvalidArgumentError, match="copy=False"):
        treecask.load(cask, {"w": np.zeros(3, np.float32)}, copy=False)


_ANON_PROBE = textwrap.dedent("""
    import sys
    import numpy as np
    import treecask

    def anon():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024

    path, copy = sys.argv[1], sys.argv[2] == "1"
    treecask.load(path, subtree="w0", copy=copy)  # warm up code paths
    base = anon()
    tree = treecask.load(path, copy=copy)
    total = sum(float(np.asarray(v).sum()) for v in tree.values())  # touch every page
    print(anon() - base, sum(v.nbytes for v in tree.values()))
""")


def test_load_without_copy_costs_no_private_memory(cask):
    tree = {f"w{i}": np.full(4 << 20, i, np.uint8) for i in range(16)}  # 64 MiB
    treecask.save(cask, tree, compression="none", durable=False)
    out = {}
    for copy in ("0", "1"):
        r = subprocess.run([sys.executable, "-c", _ANON_PROBE, str(cask), copy], capture_output=True,
                           text=True, env=os.environ, timeout=120)
        assert r.returncode == 0, r.stderr
        out[copy] = tuple(map(int, r.stdout.split()))
    assert out["0"][1] == out["1"][1] == 64 << 20
    assert out["0"][0] <= 4 << 20, out  # views: the file's pages are page cache, not RssAnon
    assert out["1"][0] >= 60 << 20, out  # the copying load, for contrast


@pytest.mark.parametrize("copy", [True, False])
def test_a_loaded_tree_is_freed_when_dropped(cask, copy):
    """No reference cycle holds a loaded tree: its memory (or its map) goes with its last
    reference, not whenever the cyclic GC happens to run."""
    import gc
    import weakref

    treecask.save(cask, {"a": {"w": np.ones((64, 64), np.float32)}, "b": [np.zeros(3), 2]}, durable=False)
    gc.collect()
    gc.disable()
    try:
        t = treecask.load(cask, copy=copy)
        ref = weakref.ref(t["a"]["w"])
        del t
        assert ref() is None
    finally:
        gc.enable()
