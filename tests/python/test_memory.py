"""Zero-copy views and the memory cost of reading one leaf of a 1 GiB archive."""

import os
import subprocess
import sys
import textwrap

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
