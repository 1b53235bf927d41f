"""Python pytrees <-> treecask treedefs.

``build(tree)`` turns any pytree into a ``PNode`` tree that knows, for every
node, its treedef kind, type name, child keys and how to rebuild the node with
new children (used to restore into a template). Node kinds:

* ``None`` -> None node;
* known boxes (``_boxes``) -> Dataclass nodes whose leaf carries the box's static metadata;
* ``dict`` -> Dict (keys sorted like ``jax.tree_util``; non-str keys stored as ``str(key)``);
* ``list`` -> List, ``tuple`` -> Tuple, namedtuples -> NamedTuple(type name, fields);
* other nodes registered with ``jax.tree_util`` (when jax is imported) -> their
  keys decide: attribute names -> Dataclass(type name, names), dict keys -> Dict,
  sequence indices -> List/Tuple, flattened indices -> Dataclass with "0", "1", ...;
* arrays, Python scalars and strings -> leaves ("data" leaves);
* functions and other callables -> "static" leaves: saved as None, restored from ``like``.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Sequence, Tuple

import numpy as np

import treecask._core as _core

from . import _boxes
from . import _jaxutil as J
from .errors import InvalidArgumentError

# NodeKind values, from the core's enum (include/treecask/types.h; fixed by the format).
LEAF, NONE, DICT, LIST, TUPLE, NAMEDTUPLE, DATACLASS = (
    _core.NODE_KINDS[k] for k in ("leaf", "none", "dict", "list", "tuple", "namedtuple", "dataclass"))
KIND_NAMES = {value: name for name, value in _core.NODE_KINDS.items()}  # value -> name

# What a leaf holds.
DATA, STATIC = "data", "static"

# Key paths (SPEC.md "Key paths"), the core's own functions (include/treecask/types.h):
# escape_key(component) escapes "~" as "~0" and "/" as "~1"; join_path(components) joins
# escaped components with "/"; split_path(path) is its inverse and raises
# InvalidArgumentError (naming the path) for a "~" not followed by 0 or 1.
escape_key: Callable[[str], str] = _core.escape_key
join_path: Callable[[Sequence[str]], str] = _core.join_key_path
split_path: Callable[[str], List[str]] = _core.split_key_path


def child_names(kind: int, keys: Sequence[str], arity: int) -> Sequence[str]:
    """The key path component of each of a node's `arity` children (SPEC.md
    "Key paths"): its keys for a dict, namedtuple or dataclass node (`keys`
    itself, not a copy: do not modify it), else "0", "1", ... (a tuple). The
    one statement of that rule, for a pytree's PNodes and a treedef's nodes
    (fold_treedef, find_node). Raises nothing."""
    if kind in _NAMED_KINDS:
        return keys
    return _INDEX_NAMES[:arity] if arity <= len(_INDEX_NAMES) else tuple(str(i) for i in range(arity))


# The kinds whose children are named by their keys, and the names of the first 256
# children of the others, made once (a restore asks for them at every inner node).
_NAMED_KINDS = frozenset({DICT, NAMEDTUPLE, DATACLASS})
_INDEX_NAMES = tuple(str(i) for i in range(256))


@dataclass
class PNode:
    kind: int
    type_name: str = ""
    keys: List[str] = field(default_factory=list)
    children: List["PNode"] = field(default_factory=list)
    obj: Any = None
    # LEAF: DATA or STATIC; inner nodes: how to rebuild with new children.
    leaf_kind: str = DATA
    rebuild: Optional[Callable[[List[Any]], Any]] = None
    box: Optional[_boxes.Box] = None
    extras: Optional[_boxes.Extras] = None  # merged box metadata (leaves only)


def is_data_leaf(x: Any) -> bool:
    """Arrays, array templates, Python scalars and strings."""
    return (isinstance(x, (bool, int, float, complex, str, np.ndarray, np.generic)) or J.is_jax_array(x)
            or J.is_shape_dtype_struct(x))


def _sorted_keys(d: dict) -> List[Any]:
    try:
        return sorted(d.keys())
    except TypeError:
        return list(d.keys())


def _key_component(k: Any) -> str:
    jtu = sys.modules.get("jax.tree_util")
    if jtu is not None:
        if isinstance(k, (jtu.DictKey, jtu.FlattenedIndexKey)):
            return str(k.key)
        if isinstance(k, jtu.SequenceKey):
            return str(k.idx)
        if isinstance(k, jtu.GetAttrKey):
            return k.name
    return str(k)


def _jax_one_level(obj: Any):
    """(key entries, children, treedef) of one level of a jax pytree node, or
    None when `obj` is a jax leaf (or jax is not imported)."""
    jax = J.jax_loaded()
    if jax is None:
        return None
    jtu = jax.tree_util
    try:
        pairs, tdef = jtu.tree_flatten_with_path(obj, is_leaf=lambda y: y is not obj)
    except Exception:
        return None
    if jtu.treedef_is_leaf(tdef) and len(pairs) == 1 and pairs[0][1] is obj:
        return None
    return [p[0] if len(p) else None for p, _ in pairs], [c for _, c in pairs], tdef


def build(tree: Any, *, path: Tuple[str, ...] = (), extras: Optional[_boxes.Extras] = None,
          strict: bool = True) -> PNode:
    """The PNode tree of `tree`. With strict=True an object that is neither a
    node, a data leaf nor a callable raises InvalidArgumentError naming its key path."""
    obj = tree
    if obj is None:
        return PNode(NONE, obj=None, rebuild=lambda ch: None)

    box = _boxes.match(obj)
    if box is not None:
        ex = box.extras(obj)
        inner = ex if extras is None else extras.merged(ex)
        fields = box.fields(obj)
        children = [build(c, path=path + (n,), extras=inner, strict=strict) for n, c in fields]
        jv = _jax_one_level(obj)

        def rebuild_box(ch, _obj=obj, _box=box, _jv=jv):
            out = _box.rebuild_like(_obj, ch)
            return _jv[2].unflatten(ch) if out is None else out

        return PNode(DATACLASS, _boxes.qualname(obj), [n for n, _ in fields], children, obj,
                     rebuild=rebuild_box, box=box)

    if is_data_leaf(obj):
        return PNode(LEAF, obj=obj, leaf_kind=DATA, extras=extras)

    t = type(obj)
    if t is dict or t is list or t is tuple:
        return _container(obj, path, strict, plain=True)
    if isinstance(obj, tuple) and hasattr(t, "_fields"):  # a namedtuple
        names = [str(f) for f in type(obj)._fields]
        children = [build(c, path=path + (n,), strict=strict) for n, c in zip(names, obj)]
        return PNode(NAMEDTUPLE, _boxes.qualname(obj), names, children, obj,
                     rebuild=lambda ch, _t=type(obj): _t(*ch))
    jv = _jax_one_level(obj)
    if jv is not None:
        keys, ch_objs, tdef = jv
        comps = [_key_component(k) for k in keys]
        children = [build(c, path=path + (n,), strict=strict) for n, c in zip(comps, ch_objs)]
        jtu = sys.modules["jax.tree_util"]
        if keys and all(isinstance(k, jtu.DictKey) for k in keys):
            kind, names = DICT, comps
        elif keys and all(isinstance(k, jtu.SequenceKey) for k in keys):
            kind, names = (LIST if isinstance(obj, list) else TUPLE), []
        else:
            kind, names = DATACLASS, comps
        return PNode(kind, _boxes.qualname(obj) if kind == DATACLASS else "", names, children, obj,
                     rebuild=lambda ch, _t=tdef: _t.unflatten(ch))

    if isinstance(obj, (dict, list, tuple)):  # a subclass jax does not know: its base kind
        return _container(obj, path, strict, plain=False)

    if callable(obj) or not strict:
        return PNode(LEAF, obj=obj, leaf_kind=STATIC)
    raise InvalidArgumentError(
        f"cannot save a leaf of type {_boxes.qualname(obj)}: leaves must be arrays, Python "
        "scalars, strings or None (filter the tree first, e.g. eqx.filter(tree, eqx.is_array))",
        key_path=join_path(path),
    )


def _rebuilt_as_base(obj: Any, path: Tuple[str, ...], parts: str, base: str, e: Exception) -> None:
    """Warns that the template's `obj` at `path`, a subclass of `base` whose type cannot be
    called with its `parts`, is restored as a plain `base` (never silently)."""
    warnings.warn(f"{join_path(path) or 'the root'}: {_boxes.qualname(obj)} cannot be built from its {parts} "
                  f"({type(e).__name__}: {e}); restored as a {base}", UserWarning, stacklevel=2)


def _container(obj: Any, path: Tuple[str, ...], strict: bool, plain: bool) -> PNode:
    """The PNode of a dict, list or tuple, or (not ``plain``) a subclass of one rebuilt as its own type if it can."""
    if isinstance(obj, dict):
        keys = _sorted_keys(obj)
        children = [build(obj[k], path=path + (str(k),), strict=strict) for k in keys]

        def rebuild_mapping(ch, _obj=obj, _keys=keys):
            new = dict(zip(_keys, ch))
            if not plain:
                try:
                    r = type(_obj)((k, new[k]) for k in _obj)
                    if r.keys() != _obj.keys():  # it took them some other way (e.g. as a first argument)
                        raise ValueError(f"it holds the keys {list(r)[:4]} after")
                    return r
                except Exception as e:
                    _rebuilt_as_base(_obj, path, "(key, value) pairs", "dict", e)
            return {k: new[k] for k in _obj}

        return PNode(DICT, "", [str(k) for k in keys], children, obj, rebuild=rebuild_mapping)
    children = [build(c, path=path + (str(i),), strict=strict) for i, c in enumerate(obj)]
    kind = LIST if isinstance(obj, list) else TUPLE

    def rebuild_seq(ch, _t=type(obj)):
        try:
            r = _t(ch)
            if len(r) != len(ch):
                raise ValueError(f"it holds {len(r)} items after")
            return r
        except Exception as e:
            _rebuilt_as_base(obj, path, "items", "list" if kind == LIST else "tuple", e)
            return list(ch) if kind == LIST else tuple(ch)

    return PNode(kind, "", [], children, obj, rebuild=type(obj) if plain else rebuild_seq)


def iter_leaves(node: PNode, path: Tuple[str, ...] = ()) -> Iterator[Tuple[Tuple[str, ...], PNode]]:
    """(components, leaf PNode) of every LEAF node in pre-order (data and static)."""
    if node.kind == LEAF:
        yield path, node
        return
    for n, c in zip(child_names(node.kind, node.keys, len(node.children)), node.children):
        yield from iter_leaves(c, path + (n,))


def box_components(node: PNode, path: Tuple[str, ...] = (),
                   flags: Tuple[bool, ...] = ()) -> Iterator[Tuple[Tuple[str, ...], Tuple[bool, ...]]]:
    """For each LEAF: its components and, per component, whether it is the field of a box."""
    if node.kind == LEAF:
        yield path, flags
        return
    for name, c in zip(child_names(node.kind, node.keys, len(node.children)), node.children):
        yield from box_components(c, path + (name,), flags + (node.box is not None,))


def to_treedef(tree: Any) -> Tuple[list, List[str], List[Any], List[Optional[_boxes.Extras]]]:
    """What saving `tree` writes, as columns: (treedef nodes in pre-order, and
    per data leaf in pre-order: its key path, its object, its merged box
    Extras or None). Static leaves (callables) become None nodes. Raises
    InvalidArgumentError naming the key path of a leaf that cannot be saved.

    The same as walking ``build(tree, strict=True)``, without a PNode for the
    plain nodes: dicts, lists, tuples, None, arrays and Python scalars of
    exactly those types are handled here (they are never boxes); any other
    object is handed to ``build`` with its key path.
    """
    nodes: list = []
    key_paths: List[str] = []
    objs: List[Any] = []
    extras: List[Optional[_boxes.Extras]] = []
    leaf_types = _PLAIN_LEAF_TYPES

    def leaf(obj: Any, kp: str):
        nodes.append(_LEAF_NODE)
        key_paths.append(kp)
        objs.append(obj)
        extras.append(None)

    def rec(obj: Any, path: Tuple[str, ...], kp: str):
        # A plain leaf child is appended in place (no call, no path tuple): a
        # tree of many small leaves spends most of its time here.
        t = type(obj)
        sep = kp + "/" if path else ""
        if t is dict:
            keys = _sorted_keys(obj)
            names = [str(k) for k in keys]
            nodes.append((DICT, len(keys), "", names))
            for k, name in zip(keys, names):
                c = obj[k]
                ckp = sep + (escape_key(name) if "~" in name or "/" in name else name)
                if type(c) in leaf_types:
                    nodes.append(_LEAF_NODE)
                    key_paths.append(ckp)
                    objs.append(c)
                    extras.append(None)
                else:
                    rec(c, path + (name,), ckp)
        elif t is list or t is tuple:
            nodes.append((LIST if t is list else TUPLE, len(obj), "", []))
            for i, c in enumerate(obj):
                name = str(i)
                if type(c) in leaf_types:
                    leaf(c, sep + name)
                else:
                    rec(c, path + (name,), sep + name)
        elif t in leaf_types:
            leaf(obj, kp)
        elif obj is None:
            nodes.append(_NONE_NODE)
        else:
            _emit(build(obj, path=path, strict=True), path, nodes, key_paths, objs, extras)

    rec(tree, (), "")
    return nodes, key_paths, objs, extras


_LEAF_NODE = (LEAF, 0, "", [])
_NONE_NODE = (NONE, 0, "", [])
_PLAIN_LEAF_TYPES = frozenset({np.ndarray, bool, int, float, complex, str})


def _emit(n: PNode, comps: Tuple[str, ...], nodes: list, key_paths: List[str], objs: List[Any],
          extras: List[Optional[_boxes.Extras]]) -> None:
    """Appends the treedef nodes and data leaves of PNode `n` at `comps` (see to_treedef)."""
    if n.kind == NONE or n.kind == LEAF and n.leaf_kind == STATIC:
        nodes.append(_NONE_NODE)
        return
    if n.kind == LEAF:
        nodes.append(_LEAF_NODE)
        key_paths.append(join_path(comps))
        objs.append(n.obj)
        extras.append(n.extras)
        return
    keys = list(n.keys) if n.kind in _NAMED_KINDS else []
    nodes.append((n.kind, len(n.children), n.type_name, keys))
    for name, c in zip(child_names(n.kind, n.keys, len(n.children)), n.children):
        _emit(c, comps + (name,), nodes, key_paths, objs, extras)


def rebuild(node: PNode, leaf_value: Callable[[Tuple[str, ...], PNode], Any],
            path: Tuple[str, ...] = ()) -> Any:
    """`node`'s object with every LEAF replaced by leaf_value(components, leaf)."""
    if node.kind == LEAF:
        return leaf_value(path, node)
    if node.kind == NONE:
        return None
    names = child_names(node.kind, node.keys, len(node.children))
    ch = [rebuild(c, leaf_value, path + (n,)) for n, c in zip(names, node.children)]
    return node.rebuild(ch)


# ---- archive treedefs ---------------------------------------------------------


def fold_treedef(nodes: Sequence[Tuple[int, int, str, Sequence[str]]],
                 inner: Callable[[int, Tuple[str, ...], int, int, List[Any]], Any], *,
                 leaves: Optional[List[Any]] = None,
                 leaf: Optional[Callable[[int, Tuple[str, ...], int], Any]] = None,
                 none: Optional[Callable[[int, Tuple[str, ...], int], Any]] = None,
                 path: Sequence[str] = (), first_leaf: int = 0) -> Any:
    """The one walk of an archive's treedef: the value of the root of `nodes`,
    folded bottom-up in a single pre-order pass (index_treedef and
    ``_restore._assemble`` are two folds).

    `nodes`: a non-empty pre-order treedef as a reader gives it (checked at
    open): ``(kind, arity, type_name, keys)`` tuples, the kinds this module's
    numbers; the whole tree, or the subtree at components `path` whose first
    leaf is leaf `first_leaf`. For the node at position p of `nodes`, at
    components c (`path`, then at each level the child's name from
    child_names), whose first leaf (or, for a NONE node, the next leaf) has
    whole-tree index k, the value is:

    * LEAF: ``leaves[k - first_leaf]`` when `leaves` is given (a list of one
      value per LEAF node of `nodes`, in order; taken inline, no call and no
      path per leaf; a node of 8 or more children that are all leaves takes
      them as one slice), else ``leaf(p, c, k)``;
    * NONE: ``none(p, c, k)`` when `none` is given, else None;
    * any other kind: ``inner(p, c, k, count, children)``: `count` leaves at
      or under it, `children` its children's values in order (a new list).

    Exactly one of `leaves` and `leaf` is given, else TypeError. Raises what
    the callbacks raise, IndexError for nodes whose arities run past their
    end, RecursionError for a tree deeper than Python's recursion limit (one
    frame per level). Leaves no reference cycle behind: nothing of the walk
    (`leaves` included) outlives the call unless a callback keeps it.
    Cost: one call of `inner` per node that is neither a leaf nor None, and
    one of child_names per node with a child that is walked with its path."""
    if (leaves is None) == (leaf is None):
        raise TypeError("fold_treedef takes exactly one of leaves and leaf")
    pos = 0
    li = 0  # leaves walked so far: leaf first_leaf + li comes next
    inline = leaves is not None

    def rec(comps: Tuple[str, ...]) -> Any:
        nonlocal pos, li
        p = pos
        kind, arity, _, keys = nodes[p]
        pos = p + 1
        if kind == LEAF:
            li += 1
            return leaves[li - 1] if inline else leaf(p, comps, first_leaf + li - 1)
        if kind == NONE:
            return None if none is None else none(p, comps, first_leaf + li)
        k = li
        if inline and arity >= 8 and nodes[pos][0] == LEAF and nodes[pos:pos + arity].count(nodes[pos]) == arity:
            # Only leaf children (a wide flat dict or list): their values as one slice.
            pos += arity
            li += arity
            return inner(p, comps, first_leaf + k, arity, leaves[k:li])
        names = None
        children = []
        for j in range(arity):
            child = nodes[pos][0]
            if child == LEAF:
                if inline:  # leaves and None inline: a tree of many small leaves lives here
                    children.append(leaves[li])
                    li += 1
                    pos += 1
                    continue
            elif child == NONE:
                if none is None:
                    children.append(None)
                    pos += 1
                    continue
            else:
                if names is None:
                    names = child_names(kind, keys, arity)
                children.append(rec(comps + (names[j],)))
                continue
            # A leaf or None child with its callback, called here (no call of rec).
            if names is None:
                names = child_names(kind, keys, arity)
            if child == LEAF:
                children.append(leaf(pos, comps + (names[j],), first_leaf + li))
                li += 1
            else:
                children.append(none(pos, comps + (names[j],), first_leaf + li))
            pos += 1
        return inner(p, comps, first_leaf + k, li - k, children)

    try:
        return rec(tuple(path))
    finally:
        # rec refers to itself through its closure: a reference cycle that would keep
        # `leaves` (a restore's every leaf: the whole tree's memory, or its map) alive
        # after the caller drops the result, until the cyclic GC happens to run.
        del rec


@dataclass
class TNode:
    """One node of a treedef read from a file, with its place in the tree."""

    index: int
    kind: int
    arity: int
    type_name: str
    keys: List[str]
    path: Tuple[str, ...]
    first_leaf: int  # leaf index of the first leaf at or under this node
    num_leaves: int
    children: List["TNode"] = field(default_factory=list)


def index_treedef(raw: Sequence[Tuple[int, int, str, Sequence[str]]], path: Tuple[str, ...] = (),
                  first_leaf: int = 0) -> Optional[TNode]:
    """The TNode tree of a pre-order treedef (None for an empty treedef): the
    whole tree's, or that of the subtree at components `path` whose first
    leaf is leaf `first_leaf` (the TNodes then carry whole-tree paths and leaf
    indices; ``index`` counts from the subtree's root). A fold_treedef;
    raises what it raises."""
    if not raw:
        return None

    def node(p: int, comps: Tuple[str, ...], k: int, count: Optional[int] = None,
             children: Optional[List[TNode]] = None) -> TNode:  # a leaf or None node: no count, no children
        kind, arity, type_name, keys = raw[p]
        return TNode(p, kind, arity, type_name, list(keys), comps, k, int(kind == LEAF) if count is None else count,
                     [] if children is None else children)

    return fold_treedef(raw, node, leaf=node, none=node, path=path, first_leaf=first_leaf)


def find_node(root: Optional[TNode], comps: Sequence[str]) -> Optional[TNode]:
    """The TNode at components `comps` below `root` (each the child's name by
    child_names), or None when there is none. Raises nothing."""
    node = root
    for c in comps:
        if node is None or node.kind in (LEAF, NONE):
            return None
        try:
            node = node.children[child_names(node.kind, node.keys, node.arity).index(c)]
        except ValueError:
            return None
    return node

