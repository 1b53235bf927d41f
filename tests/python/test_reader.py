"""The one read interface (treecask._reader.Reader): a single-file Archive and a
sharded checkpoint directory give the same public methods, with the same
answers for the same tree, and their core sources the same read methods."""

import os

import numpy as np
import pytest

import treecask
from treecask import _core
from treecask._reader import Reader
from conftest import trees_equal

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "format", "vectors")
SHARDED = os.path.join(VECTORS, "v3_1_bound")


def _single_file_copy(c, path):
    """The tree of checkpoint `c`, saved as one file at `path`."""
    treecask.save(path, c.load(), durable=False)
    return path


def test_the_former_name_of_the_sharded_reader_warns():
    with pytest.warns(DeprecationWarning, match="ShardedArchive"):
        assert treecask.ShardedCheckpoint is treecask.ShardedArchive


def test_both_readers_are_readers():
    assert issubclass(treecask.Archive, Reader) and issubclass(treecask.ShardedArchive, Reader)
    with pytest.raises(TypeError):
        Reader()
    with treecask.open(SHARDED) as c:
        assert isinstance(c, treecask.ShardedArchive) and isinstance(c, Reader)
        assert isinstance(c, treecask.Reader)  # what open() returns, whichever it reads
        assert not isinstance(c, treecask.Archive)  # an Archive is one file, nothing else


def test_a_sharded_checkpoint_and_its_single_file_copy_read_alike(cask):
    with treecask.open(SHARDED) as c, treecask.open(_single_file_copy(c, cask)) as a:
        n = len(c)  # the copy's dict keys are sorted, the vector's are not: compare by key path
        assert len(a) == n and sorted(a.keys()) == sorted(c.keys())
        assert a.subtree("")[:2] == c.subtree(())[:2] == (0, n)
        assert a.subtree("params")[1:2] == c.subtree(["params"])[1:2] == (2,)
        assert a.subtree("params/nope") is None and c.subtree("params/nope") is None
        for r in (a, c):
            by_key = dict(zip(r.keys(), r.values(0, n)))
            assert trees_equal(list(by_key.values()), [r.value(i) for i in range(n)])
            assert trees_equal(r.values(0, n, copy=False), r.values(0, n))
            assert trees_equal(r.read_many(range(n)), [r.read(i) for i in range(n)])
            assert trees_equal(r.read_many(list(reversed(range(n)))), [r.read(i) for i in reversed(range(n))])
        assert trees_equal(dict(zip(a.keys(), a.values(0, n))), dict(zip(c.keys(), c.values(0, n))))
        for k in c.keys():
            la, lc = a.leaf(k), c.leaf(k)
            for f in ("key_path", "dtype", "shape", "value_kind"):
                assert la[f] == lc[f], (k, f)
            assert lc["shards"] and not lc["zero_copy"] and c.leaf(k) is c.leaf(c.keys().index(k))
            np.testing.assert_array_equal(a.read(k), c.read(k))
            assert trees_equal(a.value(k), c.value(k))
        with pytest.raises(treecask.KeyNotFoundError):
            c.leaf("nope")
        with pytest.raises(treecask.InvalidArgumentError):
            c.value(n)
    with pytest.raises(treecask.InvalidArgumentError, match="closed"):
        c.leaf(0)


def test_the_sharded_source_has_the_archive_read_methods():
    """_core.ShardedArchive answers what a Reader asks its source, as _core.Archive does."""
    s = _core.ShardedArchive.open(SHARDED)
    idx = s.index
    n = len(s)
    assert s.treedef == idx.treedef and s.metadata == idx.metadata
    assert s.format_version == idx.format_version and s.library_version == idx.library_version
    assert s.created_unix_ns == idx.created_unix_ns
    assert s.find("params/w") == idx.find("params/w") and s.find("nope") is None
    assert s.index_of("step") == idx.index_of("step")
    assert s.subtree_nodes(["params"]) == idx.subtree_nodes(["params"])
    names, shapes, kinds, has_md, zero_copy = s.leaf_columns(0, n)
    for i in range(n):
        d = s.leaf(i)
        assert (names[i], shapes[i], kinds[i], has_md[i]) == (
            d["dtype"], d["shape"], d["value_kind"], int(bool(d["metadata"])))
    assert zero_copy == b"\0" * n and s.view_many(list(range(n)), None) == [None] * n
    with pytest.raises(IndexError):
        s.leaf_columns(1, n)
    w = s.index_of("params/w")
    shape = tuple(s.leaf(w)["shape"])
    whole = np.empty(shape, np.int32)
    s.read(w, whole)
    b = s.index_of("params/b")
    bias = np.empty(5, np.float32)
    s.read(b, bias)
    many = [np.empty(5, np.float32), np.empty(shape, np.int32)]
    s.read_many([b, w], many, None)
    np.testing.assert_array_equal(many[0], bias)
    np.testing.assert_array_equal(many[1], whole)
    boxes = [([0, 0], [6, 8]), ([2, 3], [4, 6]), ([1, 0], [5, 8])]
    outs = [np.empty(tuple(e - b for b, e in zip(*bx)), np.int32) for bx in boxes]
    s.read_slices(w, [b for b, _ in boxes], [e for _, e in boxes], outs, None)
    for (b, e), o in zip(boxes, outs):
        np.testing.assert_array_equal(o, whole[b[0]:e[0], b[1]:e[1]])
    with pytest.raises(IndexError):
        s.read_many([n], [whole], None)


@pytest.mark.parametrize("sharded", [True, False])
def test_a_bad_argument_reads_nothing(cask, sharded):
    """read_many and read_slices check every leaf's or box's arguments before
    reading any (reader.h, "arguments before bytes"): a bad second one leaves
    the first output as it was, for both sources."""
    if sharded:
        s = _core.ShardedArchive.open(SHARDED)
    else:
        with treecask.open(SHARDED) as c:
            s = _core.Archive.open(str(_single_file_copy(c, cask)))
    w, b = s.index_of("params/w"), s.index_of("params/b")
    shape = tuple(s.leaf(w)["shape"])
    first = np.full(shape, -7, np.int32)
    with pytest.raises(treecask.InvalidArgumentError):
        s.read_many([w, len(s)], [first, np.empty(5, np.float32)], None)
    with pytest.raises(treecask.ShapeError):
        s.read_many([w, b], [first, np.empty(4, np.float32)], None)
    box = np.full((2, 2), -7, np.int32)
    with pytest.raises(treecask.InvalidArgumentError):
        s.read_slices(w, [[0, 0], [0, 0]], [[2, 2], [1, shape[1] + 1]], [box, np.empty((1, shape[1] + 1), np.int32)],
                      None)
    with pytest.raises(treecask.ShapeError):
        s.read_slices(w, [[0, 0], [0, 0]], [[2, 2], [2, 2]], [box, np.empty(3, np.int32)], None)
    assert (first == -7).all() and (box == -7).all()
