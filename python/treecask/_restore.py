"""Restore: a reader's leaves and treedef back into a pytree -- what
:func:`treecask.load` and ``Reader.load`` return, and the restore into a
template (``like``).

It reads through the public methods of the one read interface
(``_reader.Reader``: ``subtree``, ``leaf``, ``info``, ``values``, ``value``,
``read``, ``read_many``, ``place``), so it restores from any reader and
imports none. Without a template the treedef is walked once
(:func:`_assemble`) over leaf values read first: in bulk (``Reader.values``),
or one by one onto jax shardings. With a template, the template's tree is
rebuilt with each of its array leaves read from the leaf at the same key path
(:func:`_like`).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _boxes, _codec, _dtypes
from . import _jaxutil as J
from . import _tree as T
from .errors import (
    Error,
    InvalidArgumentError,
    KeyNotFoundError,
    ShapeError,
    StructureError,
    _format as _format_error,
    _with_file,
)

# What restore reads from: a ``_reader.Reader`` (its public methods only). Named, not
# imported: the readers import this module, which imports none of them.
Reader = Any


def restore(a: Reader, like: Any, *, subtree: Optional[str], shardings: Any, missing: str,
            extra: str, copy: bool = True, cast: bool = False) -> Any:
    """What :func:`treecask.load` and ``Reader.load`` return, from the open
    reader `a` (arguments and errors as :func:`treecask.load`'s)."""
    file = a.path
    if cast and like is None:
        raise InvalidArgumentError("cast=True converts leaves to the template's dtypes: it needs like",
                                   file=file)
    if not copy and (like is not None or shardings is not None):
        raise InvalidArgumentError("copy=False returns read-only NumPy views of the file; it does not "
                                   "combine with like or shardings", file=file)
    if missing not in ("error", "from_like"):
        raise InvalidArgumentError(f"missing must be 'error' or 'from_like', got {missing!r}", file=file)
    if extra not in ("ignore", "error"):
        raise InvalidArgumentError(f"extra must be 'ignore' or 'error', got {extra!r}", file=file)
    try:
        prefix = tuple(T.split_path(subtree)) if subtree else ()
        sub = a.subtree(prefix)  # only the subtree's nodes and leaves reach Python
        if sub is None:
            raise KeyNotFoundError(f"no subtree '{subtree}' in the archive", file=file, key_path=subtree or "")
        first, count, nodes = sub
        if like is None:
            resolver = _sharding_resolver(shardings, a) if shardings is not None else None
            values = (a.values(first, count, copy=copy) if resolver is None
                      else [_placed(a, i, resolver, len(prefix)) for i in range(first, first + count)])
            return _assemble(a, nodes, first, values, prefix)
        start = T.index_treedef(nodes, path=prefix, first_leaf=first)
        return _like(a, start, prefix, like, _sharding_resolver(shardings, a), missing, extra,
                     bulk=shardings is None, cast=bool(cast))
    except Error as e:
        raise _with_file(e, file) from None


def _placed(a: Reader, i: int, resolver: Callable[[Tuple[str, ...], int], Any], base: int) -> Any:
    """Leaf i placed on the sharding `resolver` gives its key path below the root, else as Reader.value."""
    d = a.leaf(i)
    s = resolver(tuple(T.split_path(d["key_path"])[base:]), i)
    return a.place(i, s) if s is not None and d["value_kind"] == _codec.ARRAY else a.value(i)


def _sharding_resolver(shardings: Any, a: Reader) -> Callable[[Tuple[str, ...], int], Any]:
    """(components relative to the restored root, leaf index) -> Sharding or None."""
    if shardings is None:
        return lambda comps, i: None
    jax = J.import_jax()
    if jax is None:
        raise InvalidArgumentError("shardings needs jax")
    if isinstance(shardings, jax.sharding.Sharding):
        s = J.concrete_sharding(shardings)
        return lambda comps, i: s
    if callable(shardings):
        return lambda comps, i: J.concrete_sharding(shardings(T.join_path(comps), a.info(i)))
    # (a None node names no sharding, as a path found in no entry)
    table = {comps: leaf.obj for comps, leaf in T.iter_leaves(T.build(shardings, strict=False))}

    def resolve(comps, i):
        for k in range(len(comps), -1, -1):
            if comps[:k] in table:
                return J.concrete_sharding(table[comps[:k]])
        return None

    return resolve


def _assemble(a: Reader, nodes: Sequence[Tuple[int, int, str, Sequence[str]]], first: int,
              values: List[Any], base: Tuple[str, ...]) -> Any:
    """The tree of the pre-order treedef `nodes` (components `base`, first leaf
    `first`) with leaf `first` + k taken from values[k]: a fold of _tree.fold_treedef
    (dict, namedtuple and dataclass nodes as dicts, known boxes rebuilt)."""

    def inner(p: int, path: Tuple[str, ...], k: int, count: int, children: List[Any]) -> Any:
        kind, _, type_name, keys = nodes[p]
        if kind == T.LIST:
            return children
        if kind == T.TUPLE:
            return tuple(children)
        fields = dict(zip(keys, children))
        return _rebuild_box(a, type_name, fields, k, path) if kind == T.DATACLASS and count else fields

    return T.fold_treedef(nodes, inner, leaves=values, path=base, first_leaf=first)


def _rebuild_box(a: Reader, type_name: str, fields: Dict[str, Any], first_leaf: int,
                 path: Tuple[str, ...]) -> Any:
    """A known box of `type_name` rebuilt from its fields, else (or, warned, when that fails) the fields."""
    k = _boxes.known(type_name)
    if k is not None:
        box, cls = k
        try:
            return box.rebuild(cls, fields, a.leaf(first_leaf))
        except Exception as e:  # e.g. an incompatible library version
            warnings.warn(f"treecask: could not rebuild {type_name} at "
                          f"'{T.join_path(path)}' ({e}); returning its fields as a dict")
    return fields


def _like(a: Reader, start: T.TNode, prefix: Tuple[str, ...], like: Any, resolver,
          missing: str, extra: str, bulk: bool = False, cast: bool = False) -> Any:
    """`like` rebuilt with each of its data leaves read from the leaf at the same key path
    under `start`, checked (_check) and converted (_convert; with `cast`, _cast_leaf)."""
    file = a.path
    pt = T.build(like, strict=False)
    flags = dict(T.box_components(pt))

    # Plan: which archive leaf each data leaf of `like` comes from.
    plan: Dict[Tuple[str, ...], Optional[int]] = {}
    objs: Dict[Tuple[str, ...], Any] = {}  # the template leaf at each planned key path
    for comps, leaf in T.iter_leaves(pt):
        if leaf.leaf_kind != T.DATA:
            continue
        objs[comps] = leaf.obj
        idx = _resolve(start, comps, flags.get(comps, ()))
        if idx is None:
            if missing == "error" or J.is_shape_dtype_struct(leaf.obj):
                why = ("; pass missing='from_like' to keep like's value" if missing == "error"
                       else " and like holds no value to keep (a ShapeDtypeStruct)")
                raise StructureError("the checkpoint has no leaf here" + why, file=file, key_path=_join(prefix, comps))
        else:
            _check(a.leaf(idx), leaf.obj, _join(prefix, comps), file, cast)
        plan[comps] = idx

    if extra == "error":
        used = {i for i in plan.values() if i is not None}
        unused = [a.leaf(i)["key_path"] for i in range(start.first_leaf, start.first_leaf + start.num_leaves)
                  if i not in used]
        if unused:
            more = f" (and {len(unused) - 5} more)" if len(unused) > 5 else ""
            raise StructureError(
                f"the checkpoint has {len(unused)} leaves the template lacks: {', '.join(unused[:5])}{more}",
                file=file, key_path=unused[0])

    # Read in one bulk call every planned leaf that _convert takes as a host
    # array: not those it places on a jax.Array template's own sharding
    # (Reader.place reads their boxes itself).
    pre: Dict[int, np.ndarray] = {}
    if bulk:
        todo = sorted({i for comps, i in plan.items()
                       if i is not None and not _placed_by_template(a, i, objs[comps])})
        pre = dict(zip(todo, a.read_many(todo)))

    def leaf_value(comps, leaf: T.PNode):
        if leaf.leaf_kind != T.DATA:
            return leaf.obj
        idx = plan.get(comps)
        if idx is None:
            return leaf.obj
        sharding = resolver(comps, idx)
        if cast and _needs_cast(a.leaf(idx), leaf.obj):
            return _cast_leaf(a, idx, leaf.obj, sharding, pre)
        return _convert(a, idx, leaf.obj, sharding, pre)

    return T.rebuild(pt, leaf_value)


def _resolve(start: T.TNode, comps: Tuple[str, ...], flags: Tuple[bool, ...]) -> Optional[int]:
    n = T.find_node(start, comps)
    if n is not None:  # a leaf, or saved boxed and the template unboxed
        box = n.kind == T.DATACLASS and n.num_leaves == 1 and _boxes.known(n.type_name) is not None
        return n.first_leaf if n.kind == T.LEAF or box else None
    if any(flags):  # template boxed, saved unboxed
        bare = tuple(c for c, f in zip(comps, flags) if not f)
        n = T.find_node(start, bare)
        if n is not None and n.kind == T.LEAF:
            return n.first_leaf
    return None


def _shape_str(name: str, shape: Sequence[int]) -> str:
    return f"{name}[{', '.join(str(int(s)) for s in shape)}]"


def _check(info: Dict[str, Any], x: Any, key_path: str, file: str, cast: bool = False) -> None:
    """Raises ShapeError ("shape mismatch", or "dtype mismatch" where only the dtype
    differs) when leaf `info` cannot restore template leaf `x` (with `cast`, of another numeric dtype)."""
    name, shape, kind = info["dtype"], tuple(info["shape"]), info["value_kind"]
    got = _shape_str(name, shape) + ("" if kind == _codec.ARRAY else f" ({_codec.VALUE_KIND_NAMES[kind]})")

    def bad(expected: str, dtype_only: bool = False):
        msg = f"the template expects {expected}, the checkpoint has {got}"
        if dtype_only:
            msg += "; pass cast=True to convert it to the template's dtype"
            raise ShapeError(msg, file=file, key_path=key_path,
                             what=_format_error(file, key_path, "dtype mismatch", msg))
        raise ShapeError(msg, file=file, key_path=key_path)

    for scalar_type, names, expected in _SCALAR_TEMPLATES:  # bool before int: a bool is an int
        if isinstance(x, scalar_type):
            if name not in names or shape != ():
                bad(expected)
            return
    if isinstance(x, str):
        if kind != _codec.STR:
            bad("a str")
        return
    xshape = tuple(int(s) for s in x.shape)
    if kind in (_codec.INT, _codec.FLOAT, _codec.BOOL) and xshape == ():
        # A Python scalar in the file restores into any 0-d array of its kind.
        try:
            xname = _dtypes.to_name(x.dtype)
        except Error:
            xname = ""
        ok = {_codec.INT: _INT_NAMES, _codec.FLOAT: _FLOAT_NAMES, _codec.BOOL: {"bool"}}[kind]
        if xname not in ok and not (cast and xname in _NUMERIC_NAMES):
            bad(f"a 0-d {xname or x.dtype} array", dtype_only=True)
        return
    if J.is_prng_dtype(x.dtype):
        if J.KEY_IMPL_META not in info["metadata"] or shape[: len(xshape)] != xshape:
            bad(f"a PRNG key array {x.dtype}[{', '.join(map(str, xshape))}]")
        return
    try:
        xname = _dtypes.to_name(x.dtype)
    except Error:
        xname = str(np.dtype(x.dtype))
    if xshape != shape:
        bad(_shape_str(xname, xshape))
    if xname != name and not (cast and kind == _codec.ARRAY and name in _NUMERIC_NAMES
                              and xname in _NUMERIC_NAMES):
        bad(_shape_str(xname, xshape), dtype_only=True)


def _needs_cast(info: Dict[str, Any], x: Any) -> bool:
    """Whether archive leaf `info`, an array, restores into template array leaf `x` of another dtype."""
    if info["value_kind"] != _codec.ARRAY or isinstance(x, (bool, int, float, complex, str)):
        return False
    want = getattr(x, "dtype", None)
    if want is None or J.is_prng_dtype(want):
        return False
    try:
        return _dtypes.to_name(want) != info["dtype"]
    except Error:
        return False


def _cast_leaf(a: Reader, i: int, x: Any, sharding: Any, pre: Dict[int, np.ndarray]) -> Any:
    """Leaf i read on the host, converted to `x`'s dtype there (NumPy ``astype``: no detour
    through a dtype jax lacks) and placed on `sharding` (or `x`'s own) for a jax template."""
    arr = _array(a, i, pre).astype(x.dtype)
    if isinstance(x, np.generic):
        return arr[()]
    if J.is_jax_array(x) or J.is_shape_dtype_struct(x):
        return J.to_jax(arr, sharding if sharding is not None else _own_sharding(x))
    return J.to_jax(arr, sharding) if sharding is not None else arr


def _array(a: Reader, i: int, pre: Dict[int, np.ndarray]) -> np.ndarray:
    """Leaf i's array, taken out of `pre` (Reader.read_many's) when it is there, else read now."""
    arr = pre.pop(i, None)
    return a.read(i) if arr is None else arr


def _convert(a: Reader, i: int, x: Any, sharding: Any, pre: Dict[int, np.ndarray]) -> Any:
    """Leaf i as template leaf `x`'s type, placed on `sharding` when it is an array and `sharding` is given."""
    if isinstance(x, (bool, int, float, complex, str)):
        v = a.value(i, pre.pop(i, None))
        if isinstance(v, np.ndarray):
            v = v[()].item() if v.shape == () else v
        return type(x)(v)
    d = a.leaf(i)
    scalar = d["value_kind"] in (_codec.INT, _codec.FLOAT, _codec.BOOL)
    if isinstance(x, np.generic):
        arr = _array(a, i, pre)
        return arr.astype(x.dtype)[()] if scalar else arr[()]
    if J.is_jax_array(x) or J.is_shape_dtype_struct(x):
        if sharding is None:
            sharding = _own_sharding(x)
        if scalar:  # a Python scalar in the file, cast to the template's 0-d dtype
            return J.to_jax(_array(a, i, pre).astype(x.dtype), sharding)
        if sharding is not None:
            return a.place(i, sharding)
        v = a.value(i, pre.pop(i, None))
        return v if J.is_jax_array(v) else J.to_jax(v)
    if sharding is not None and not scalar:
        return a.place(i, sharding)
    if scalar and isinstance(x, np.ndarray):
        return _array(a, i, pre).astype(x.dtype)
    return a.value(i, pre.pop(i, None))


def _own_sharding(x: Any) -> Any:
    """The sharding of a jax.Array or ShapeDtypeStruct template leaf, made concrete, or None."""
    return J.concrete_sharding(getattr(x, "sharding", None))


def _placed_by_template(a: Reader, i: int, x: Any) -> bool:
    """Whether _convert places leaf i on template leaf x's own sharding (Reader.place)."""
    return ((J.is_jax_array(x) or J.is_shape_dtype_struct(x))
            and a.leaf(i)["value_kind"] not in (_codec.INT, _codec.FLOAT, _codec.BOOL)
            and _own_sharding(x) is not None)


def _join(prefix: Sequence[str], comps: Sequence[str]) -> str:
    return T.join_path(list(prefix) + list(comps))


# The format's dtypes a Python scalar of each type restores from (SPEC.md "Scalar leaves"):
# every integer, floating (the low-precision and packed ones included: SPEC.md "Dtypes") and
# complex dtype, named as in _dtypes.
_ALL_NAMES = _dtypes.PLAIN_DTYPES.keys() | _dtypes.PACKED
_FLOAT_NAMES = frozenset(n for n in _ALL_NAMES if n.startswith(("float", "bfloat")))
_INT_NAMES = frozenset(n for n in _ALL_NAMES if n.startswith(("int", "uint")))
_COMPLEX_NAMES = frozenset(n for n in _ALL_NAMES if n.startswith("complex"))
# (Python scalar type of a template leaf, the dtypes it restores from, what the error says it expects).
_NUMERIC_NAMES = _FLOAT_NAMES | _INT_NAMES | _COMPLEX_NAMES | {"bool"}
_SCALAR_TEMPLATES = ((bool, frozenset({"bool"}), "a bool"), (int, _INT_NAMES, "an int"),
                     (float, _FLOAT_NAMES, "a float"), (complex, _COMPLEX_NAMES, "a complex"))
