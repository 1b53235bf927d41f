"""The bulk paths of save and load (one call per tree, not one per leaf):
array layouts that save hands to the core as they are or converts, partial
restores with load(subtree=) that read only their part of the treedef, and
the columnar entry points of treecask._core checked against the per-leaf ones."""

import collections

import ml_dtypes
import numpy as np
import pytest

import treecask
from treecask import _archive, _core
from treecask import _tree as T
from conftest import trees_equal

Point = collections.namedtuple("Point", "x y")


def nested_tree():
    rng = np.random.default_rng(3)
    return {
        "params": {
            "enc": {"w": rng.standard_normal((4, 3)).astype(np.float32), "b": np.zeros(3, np.float16)},
            "dec": [rng.integers(0, 9, 5), (np.ones(2, ml_dtypes.bfloat16), None, 7)],
            "a/b": {"c~d": np.arange(4, dtype=ml_dtypes.int4)},
        },
        "pt": Point(np.arange(3, dtype=np.uint8), "txt"),
        "step": 12,
        "lr": 0.25,
        "done": False,
        "empty": {},
        "nothing": None,
        "t": (),
    }


def subtree_of(tree, comps):
    """What load() returns at components `comps` of the plain result of `tree`."""
    node = tree
    for c in comps:
        node = node[int(c)] if isinstance(node, (list, tuple)) and not hasattr(node, "_fields") else (
            getattr(node, c) if hasattr(node, "_fields") else node[c])
    if hasattr(node, "_fields"):
        return dict(zip(node._fields, node))
    return node


def all_paths(tree, comps=()):
    """Components of every node of a dict/list/tuple/namedtuple tree, in pre-order."""
    yield comps
    if isinstance(tree, dict):
        for k in sorted(tree):
            yield from all_paths(tree[k], comps + (k,))
    elif isinstance(tree, (list, tuple)):
        names = tree._fields if hasattr(tree, "_fields") else [str(i) for i in range(len(tree))]
        for n, c in zip(names, tree):
            yield from all_paths(c, comps + (n,))


def test_subtree_equals_the_part_of_a_full_load(cask):
    tree = nested_tree()
    treecask.save(cask, tree, durable=False)
    full = treecask.load(cask)
    paths = list(all_paths(tree))
    assert len(paths) > 20
    for comps in paths:
        key = T.join_path(comps)
        part = treecask.load(cask, subtree=key or None)
        want = subtree_of(full, comps)
        assert trees_equal(part, want), key
        # And the same part of the original tree (namedtuples come back as dicts).
        assert trees_equal(part, subtree_of(tree, comps) if not isinstance(want, dict) else want), key
    assert treecask.load(cask, subtree="params/a~1b/c~0d").dtype == ml_dtypes.int4
    assert treecask.load(cask, subtree="pt/y") == "txt"
    assert treecask.load(cask, subtree="nothing") is None
    assert treecask.load(cask, subtree="params/dec/1/1") is None


@pytest.mark.parametrize("key", ["params/x", "params/enc/w/0", "params/dec/2", "params/dec/01", "step/x",
                                 "nothing/x", "t/0", "params/a/b", "pt/z", "params/enc/"])
def test_subtree_that_is_not_there(cask, key):
    treecask.save(cask, nested_tree(), durable=False)
    with pytest.raises(treecask.KeyNotFoundError) as e:
        treecask.load(cask, subtree=key)
    assert isinstance(e.value, KeyError) and e.value.key_path == key and e.value.file == str(cask)
    assert f"no subtree '{key}' in the archive" in str(e.value)


def test_subtree_reads_only_its_part(cask, monkeypatch):
    """A partial restore without a template walks to the subtree in the core:
    no TNode index of the tree and no per-leaf dict of other leaves."""
    tree = {f"b{i:02d}": {f"p{j:02d}": np.full(3, i * 100 + j, np.float32) for j in range(20)} for i in range(20)}
    treecask.save(cask, tree, durable=False)

    def forbidden(*args, **kwargs):
        raise AssertionError("indexed the whole tree")

    monkeypatch.setattr(T, "index_treedef", forbidden)
    monkeypatch.setattr(_archive._LeafInfos, "__getitem__", forbidden)
    seen = []
    real = _archive.Archive._subtree
    monkeypatch.setattr(_archive.Archive, "_subtree", lambda self, comps: seen.append(real(self, comps)) or seen[-1])
    assert np.array_equal(treecask.load(cask, subtree="b07/p13"), np.full(3, 713, np.float32))
    part = treecask.load(cask, subtree="b19")
    assert trees_equal(part, tree["b19"])
    assert [(first, count, len(nodes)) for first, count, nodes in seen] == [(7 * 20 + 13, 1, 1), (380, 20, 21)]


def test_one_treedef_walk_with_inline_leaves_or_callbacks(cask):
    """_tree.fold_treedef gives the same fold whether leaves come inline (a
    list, as a restore takes them; wide leaf-only nodes as one slice) or from
    the leaf callback, and walks every leaf at its key path."""
    tree = nested_tree()
    tree["wide"] = {f"k{i:02d}": np.float32(i) for i in range(9)}  # one slice
    tree["wide_list"] = [np.int8(i) for i in range(8)]            # one slice, still a list
    tree["with_none"] = [np.int8(i) for i in range(8)] + [None]   # a None: leaf by leaf
    treecask.save(cask, tree, durable=False)
    with treecask.open(cask) as a:
        first, count, nodes = a.subtree(())
        keys = a.keys()

        def inner(p, comps, k, n, children):
            return ("node", p, comps, k, n, children)

        walked = []

        def leaf(p, comps, k):
            walked.append((T.join_path(comps), k))
            return ("leaf", k)

        inline = T.fold_treedef(nodes, inner, leaves=[("leaf", k) for k in range(count)])
        assert inline == T.fold_treedef(nodes, inner, leaf=leaf)
        assert walked == [(kp, k) for k, kp in enumerate(keys)]
        assert T.fold_treedef(nodes, inner, leaf=leaf, none=lambda p, comps, k: ("none", p)) != inline
        with pytest.raises(TypeError):
            T.fold_treedef(nodes, inner)
        first, count, nodes = a.subtree(("params",))
        sub = T.fold_treedef(nodes, inner, leaves=list(range(first, first + count)), path=("params",),
                             first_leaf=first)
        assert sub[2:5] == (("params",), first, count)
        assert trees_equal(treecask.load(cask, subtree="wide"), tree["wide"])
        for k in ("wide_list", "with_none"):
            got = treecask.load(cask, subtree=k)
            assert type(got) is list and trees_equal(got, tree[k])


def test_subtree_nodes_and_leaf_columns_match_the_per_leaf_calls(cask):
    tree = nested_tree()
    treecask.save(cask, tree, durable=False)
    a = _core.Archive.open(str(cask))
    whole = a.treedef
    root = T.index_treedef(whole)

    def walk(n):
        yield n
        for c in n.children:
            yield from walk(c)

    count = 0
    for n in walk(root):
        first, num, nodes = a.subtree_nodes(list(n.path))
        size = sum(1 for _ in walk(n))
        assert (first, num) == (n.first_leaf, n.num_leaves)
        assert [tuple(x[:3]) + (tuple(x[3]),) for x in nodes] == \
            [tuple(x[:3]) + (tuple(x[3]),) for x in whole[n.index:n.index + size]]
        count += 1
    assert count == len(whole)
    assert a.subtree_nodes(["params", "nope"]) is None and a.subtree_nodes(["step", "x"]) is None

    names, shapes, kinds, has_md, zero_copy = a.leaf_columns(0, len(a))
    for i in range(len(a)):
        d = a.leaf(i)
        assert (names[i], shapes[i], kinds[i], has_md[i], zero_copy[i]) == (
            d["dtype"], d["shape"], d["value_kind"], int(bool(d["metadata"])), int(d["zero_copy"]))
    assert a.leaf_columns(len(a), 0) == ([], [], b"", b"", b"")
    with pytest.raises(IndexError):
        a.leaf_columns(1, len(a))


def test_array_layouts_round_trip(cask):
    """Arrays whose memory is not their file bytes are converted; the others are passed as they are."""
    base = np.arange(60, dtype=np.float64).reshape(6, 10)
    ro = np.arange(5, dtype=np.int32)
    ro.flags.writeable = False
    tree = {
        "fortran": np.asfortranarray(base),
        "strided": base[::2, 1::3],
        "transposed": base.T,
        "big_endian": base.astype(">f8"),
        "big_endian_int": np.arange(7, dtype=">i2"),
        "readonly": ro,
        "empty": np.zeros((3, 0), np.float32),
        "zero_d": np.array(1.5, np.float32),
        "numpy_scalar": np.int16(-3),
        "view_of_buffer": np.frombuffer(bytes(range(16)), np.uint8)[3:11],
        "bfloat16_t": np.ones((2, 3), ml_dtypes.bfloat16).T,
        "int4": np.arange(-4, 3, dtype=ml_dtypes.int4),
    }
    treecask.save(cask, tree, durable=False)
    back = treecask.load(cask)
    for k, x in tree.items():
        want = np.asarray(x)
        got = back[k]
        assert got.dtype == want.dtype.newbyteorder("=") and got.shape == want.shape, k
        assert got.flags.c_contiguous and got.flags.writeable, k
        np.testing.assert_array_equal(got, want, err_msg=k)
    with treecask.open(cask) as a:
        assert a.info("big_endian").dtype_name == "float64" and a.info("numpy_scalar").shape == ()
        np.testing.assert_array_equal(a["transposed"], base.T)


def test_save_errors_keep_their_key_paths(cask):
    with pytest.raises(treecask.InvalidArgumentError) as e:
        treecask.save(cask, {"ok": np.ones(2), "bad": {"x": np.array([{}], dtype=object)}})
    assert e.value.key_path == "bad/x"
    with pytest.raises(treecask.InvalidArgumentError) as e:
        treecask.save(cask, [np.ones(1), np.zeros(2, dtype=[("a", "i4")])])
    assert e.value.key_path == "1"
    assert not cask.exists()
