"""A checkpoint's items in treecask archives for ``treecask.orbax`` and ``v1``: Orbax's per-leaf
arguments, the encoding of a save's items, :class:`Checkpoint` (read back) and the restore and
metadata of an item (docs/python.md "Switching from Orbax in one line")."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .. import _jaxutil as J
from . import args as args
from .. import _restore as _R
from .. import _tree as T
from .. import stores
from . import _layout as _L
from ._metadata import StringMetadata, TreeMetadata, _leaf_metadata
from .._open import load as _load
from .._open import open as _open
from ..errors import InvalidArgumentError, NotFoundError, StructureError, UnsupportedError


#: The item name of a checkpoint of one item (Orbax's).
DEFAULT_ITEM_NAME = "default"

# Archive metadata of a step written by treecask.orbax (a step without it is one
# PyTree item at the archive root, as treecask.CheckpointManager writes).
_LAYOUT_KEY = "treecask.orbax.items"  # JSON {"default": bool, "items": {name: "pytree"|"json"|"array"}}
_JSON_PREFIX = "treecask.orbax.json/"  # + item name: a JSON item's text
_CUSTOM_KEY = "treecask.orbax.custom_metadata"  # JSON of save(custom_metadata=...)
_STATE_PREFIX = "treecask.orbax.state/"  # + item name: a stateful checkpointable's get_state() as JSON
_JAX_PREFIX = "treecask.orbax.jax/"  # + item name: JSON list of the key paths (in the item) of jax.Array leaves


class Where(str):
    """A checkpoint's redacted display text (a str) carrying its store and path (``stores.resolve``)."""

    store: stores.Store
    key: str

    def __new__(cls, directory: Any, store: Optional[stores.Store] = None) -> "Where":
        if isinstance(directory, Where) and store is None:
            return directory
        st, key = stores.resolve(directory, store)
        self = super().__new__(cls, st.display(key))
        self.store, self.key = st, key
        return self

    def open(self) -> Any:
        """``treecask.open`` of the checkpoint."""
        return _open(self.key, store=self.store)

    def load(self, *args: Any, **kwargs: Any) -> Any:
        """``treecask.load`` of the checkpoint."""
        return _load(self.key, *args, store=self.store, **kwargs)


def _publish(namespace: Dict[str, Any]) -> None:
    """Names the classes of a package's ``__all__`` from its private modules as the package's."""
    for name in namespace["__all__"]:
        cls = namespace[name]
        if isinstance(cls, type) and cls.__module__.startswith(namespace["__name__"] + "._"):
            cls.__module__ = namespace["__name__"]


def _unsupported(feature: str, why: str, file: str = "", by: str = "treecask.orbax") -> UnsupportedError:
    return UnsupportedError(f"Orbax {feature} is not supported by {by}: {why}", file=file)


def _unsupported_names(module: str, prefix: str, table: Mapping[str, str], by: str = "treecask.orbax") -> Any:
    """A module ``__getattr__``: UnsupportedError for Orbax's names in `table`, else AttributeError."""
    def __getattr__(name: str) -> Any:
        why = table.get(name)
        if why is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        raise _unsupported(f"{prefix}{name}", why, by=by)
    return __getattr__


# ---------------------------------------------------------------- per-leaf arguments


@dataclasses.dataclass
class SaveArgs:
    """How one leaf is saved (Orbax ``SaveArgs``). ``dtype``: cast the leaf to
    it before saving (Orbax's rule). ``aggregate``, ``chunk_byte_size``,
    ``shard_axes`` tune Orbax's TensorStore layout: accepted, no effect on an
    archive (whose chunking is ``treecask.save``'s ``chunk_size``)."""

    aggregate: bool = False
    dtype: Optional[Any] = None
    chunk_byte_size: Optional[int] = None
    shard_axes: Tuple[int, ...] = ()


@dataclasses.dataclass
class RestoreArgs:
    """How one leaf is restored (Orbax ``RestoreArgs``). ``restore_type``:
    ``np.ndarray`` returns a NumPy array, ``jax.Array`` a jax array (None: as
    the target's leaf, or NumPy without a target). ``dtype``: cast to it."""

    restore_type: Optional[Any] = None
    dtype: Optional[Any] = None


@dataclasses.dataclass
class ArrayRestoreArgs(RestoreArgs):
    """Restore one leaf as a ``jax.Array`` on devices (Orbax ``ArrayRestoreArgs``).

    ``sharding`` (a ``jax.sharding.Sharding``), or ``mesh`` + ``mesh_axes``
    (a PartitionSpec), says where: each device reads only its own box from the
    archive (``treecask.load(shardings=...)``). ``dtype`` casts. ``global_shape``
    / ``shape``, when given, must equal the saved shape (Orbax's padding or
    truncation to another shape raises ``UnsupportedError``). ``restore_type``
    None means ``jax.Array``.
    """

    mesh: Optional[Any] = None
    mesh_axes: Optional[Any] = None
    sharding: Optional[Any] = None
    global_shape: Optional[Tuple[int, ...]] = None
    shape: Optional[Tuple[int, ...]] = None
    strict: bool = True


@dataclasses.dataclass
class Transform:
    """How one leaf of a restore target is filled from the checkpoint (Orbax
    ``Transform``, given as ``PyTreeRestore(item=target, transforms={key:
    Transform(...)})``; a key is a regular expression that must fully match
    the target leaf's key path, ``a/b/0``). ``original_key``: the key path in
    the checkpoint to take it from (``\\1``... refer to the key's groups;
    default: the same key path). ``value_fn``: applied to that value.
    ``use_fallback``: keep the target's value where the checkpoint has none.
    ``multi_value_fn`` raises UnsupportedError (restore raw and combine)."""

    original_key: Optional[Any] = None
    use_fallback: bool = False
    value_fn: Optional[Any] = None
    multi_value_fn: Optional[Any] = None


def _is_restore_arg(x: Any) -> bool:
    """A RestoreArgs / ArrayRestoreArgs, treecask's or Orbax's."""
    return not isinstance(x, type) and hasattr(x, "restore_type") and hasattr(x, "dtype")


def _sharding_of(ra: Any) -> Any:
    """The jax Sharding an (Array)RestoreArgs asks for, or None."""
    s = getattr(ra, "sharding", None)
    mesh, axes = getattr(ra, "mesh", None), getattr(ra, "mesh_axes", None)
    if s is None and mesh is None:
        return None
    jax = J.import_jax()
    if s is None:
        if axes is None:
            raise _unsupported("ArrayRestoreArgs(mesh=...) without mesh_axes", "give a sharding or mesh_axes")
        return jax.sharding.NamedSharding(mesh, axes)
    if isinstance(s, jax.sharding.Sharding):
        return s
    to_jax = getattr(s, "to_jax_sharding", None)  # Orbax's ShardingMetadata
    if to_jax is None:
        raise _unsupported(f"ArrayRestoreArgs(sharding={type(s).__name__})", "give a jax.sharding.Sharding")
    return to_jax()


def _key_path(entries: Sequence[Any]) -> str:
    """A jax key path as a treecask key path (SPEC.md "Key paths")."""
    return T.join_path([T._key_component(k) for k in entries])


def _apply_save_args(item: Any, save_args: Any) -> Any:
    """`item` with each leaf whose SaveArgs has a dtype cast to it."""
    if save_args is None or (jax := J.import_jax()) is None:
        return item
    leaves = jax.tree_util.tree_leaves(save_args, is_leaf=lambda x: hasattr(x, "aggregate"))
    if not any(getattr(sa, "dtype", None) is not None for sa in leaves):
        return item

    def cast(x, sa):
        dt = getattr(sa, "dtype", None)
        return x if dt is None or not hasattr(x, "astype") or getattr(x, "dtype", None) == dt else x.astype(dt)

    return jax.tree_util.tree_map(cast, item, save_args, is_leaf=lambda x: hasattr(x, "aggregate"))


def _apply_leaf_args(tree: Any, flat: Mapping[str, Any]) -> Any:
    """Each leaf of `tree` converted as its RestoreArgs says (dtype, restore_type)."""
    jax = J.import_jax()

    def convert(path, v):
        ra = flat.get(_key_path(path))
        if ra is None or not (isinstance(v, (np.ndarray, np.generic)) or J.is_jax_array(v)):
            return v
        want = getattr(ra, "global_shape", None) or getattr(ra, "shape", None)
        if want is not None and tuple(want) != tuple(np.shape(v)):
            raise _unsupported(f"ArrayRestoreArgs(global_shape={tuple(want)})",
                               f"the checkpoint's shape is {tuple(np.shape(v))} (no padding or truncation)")
        dt = getattr(ra, "dtype", None)
        if dt is not None and v.dtype != np.dtype(dt):
            v = v.astype(dt)
        rt = getattr(ra, "restore_type", None)
        if rt is np.ndarray and J.is_jax_array(v):
            return np.asarray(v)
        array_ra = hasattr(ra, "sharding") or hasattr(ra, "mesh")  # an ArrayRestoreArgs
        if (rt is jax.Array or (rt is None and array_ra)) and not J.is_jax_array(v):
            return J.to_jax(v)
        return v

    return jax.tree_util.tree_map_with_path(convert, tree)


def _to_shape_dtype_struct(x: Any, dtype: Any = None, scalar_dtype: Any = None, sharding: Any = None) -> Any:
    """Orbax ``utils.to_shape_dtype_struct``: an array, ShapeDtypeStruct or ArrayMetadata as a ShapeDtypeStruct."""
    jax = J.import_jax()
    if isinstance(x, (int, float, bool, complex)) and not hasattr(x, "shape"):
        return x if scalar_dtype is None else scalar_dtype(x)
    if isinstance(x, StringMetadata):
        return ""  # a str target
    if sharding is None:
        sharding = getattr(x, "sharding", None)
        if sharding is not None and not isinstance(sharding, jax.sharding.Sharding):
            to_jax = getattr(sharding, "to_jax", None) or getattr(sharding, "to_jax_sharding", None)
            sharding = to_jax() if to_jax is not None else None  # ArrayMetadata's ShardingInfo
    if isinstance(x, np.ndarray):
        sharding = None
    return jax.ShapeDtypeStruct(tuple(x.shape), dtype or x.dtype, sharding=sharding)


def _construct_restore_args(target: Any, sharding_tree: Any = None, set_global_shape: bool = True) -> Any:
    """Orbax ``checkpoint_utils.construct_restore_args``: each target leaf's (Array)RestoreArgs."""
    jax = J.import_jax()

    def one(x, s=None):
        if J.is_jax_array(x) or J.is_shape_dtype_struct(x):
            return ArrayRestoreArgs(restore_type=jax.Array, dtype=x.dtype,
                                    sharding=s if s is not None else getattr(x, "sharding", None),
                                    global_shape=tuple(x.shape) if set_global_shape else None)
        if isinstance(x, np.ndarray):
            return RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)
        return RestoreArgs(restore_type=type(x))

    return jax.tree_util.tree_map(one, target, *([] if sharding_tree is None else [sharding_tree]))


# ---------------------------------------------------------------- items in an archive


def _layout(md: Mapping[str, str]) -> Tuple[bool, Dict[str, str]]:
    """(default-item mode, {item name: kind}) of a step from its archive metadata."""
    raw = md.get(_LAYOUT_KEY)
    if raw is None:
        return True, {DEFAULT_ITEM_NAME: "pytree"}
    d = json.loads(raw)
    return bool(d["default"]), dict(d["items"])


def _encode_items(save_args: Any, custom_metadata: Any, file: str) -> Tuple[Dict[str, Tuple[Any, Dict[str, str]]],
                                                                               Dict[str, str]]:
    """({name: (tree, archive metadata)}, the checkpoint's own metadata) of a save's items."""
    op, kind = args.kind(save_args)
    if kind == "composite":
        named, default = args.composite_items(save_args), False
        if not named:
            raise InvalidArgumentError("Composite() holds no item to save", file=file)
    elif op == "save":
        named, default = {DEFAULT_ITEM_NAME: save_args}, True
    else:
        raise InvalidArgumentError(f"save needs Orbax save arguments (args.StandardSave(...)...), got {kind}",
                                   file=file)
    items: Dict[str, Tuple[Any, Dict[str, str]]] = {}
    custom = custom_metadata
    for name, a in named.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"an item name is a non-empty str, got {name!r}", file=file)
        op, k = args.kind(a)
        if op != "save":
            raise InvalidArgumentError(f"item '{name}': Orbax save arguments expected, got {k}", file=file)
        imd, tree = {_L.KIND_KEY: "pytree" if default and k == "array" else k}, None
        if k == "pytree" and _is_stateful(a.item):
            imd[_L.KIND_KEY] = "stateful"
            try:
                imd[_STATE_PREFIX + name] = json.dumps(a.item.get_state())
            except (TypeError, ValueError) as e:
                raise UnsupportedError(f"item '{name}': get_state() of {type(a.item).__name__} is not JSON ({e}); "
                                       "treecask.orbax stores a stateful checkpointable's state as JSON, as Orbax "
                                       "stores Grain's", file=file) from None
        elif k == "json":
            try:
                imd[_JSON_PREFIX + name] = json.dumps(a.item)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"item '{name}' (JsonSave) is not JSON-serialisable: {e}",
                                           file=file) from None
        else:
            tree = _apply_save_args(a.item, getattr(a, "save_args", None))
            # the key paths of its jax.Array leaves: Orbax restores those as jax arrays when no
            # target says otherwise, so a save records them
            jax = J.jax_loaded()
            jl = [] if jax is None else [_key_path(kp) for kp, x in jax.tree_util.tree_flatten_with_path(tree)[0]
                                         if J.is_jax_array(x)]
            if jl:
                imd[_JAX_PREFIX + name] = json.dumps(jl)
            if getattr(a, "custom_metadata", None) is not None and custom is None:
                custom = a.custom_metadata
        items[name] = (tree, imd)
    own = {_CUSTOM_KEY: json.dumps(custom)} if custom is not None else {}
    if default:  # one item saved without a name (a manager's "default"): restored as the item itself
        own[_LAYOUT_KEY] = json.dumps({"default": True, "items": {DEFAULT_ITEM_NAME: imd[_L.KIND_KEY]}},
                                      sort_keys=True)
    return items, own


def _encode(save_args: Any, custom_metadata: Any, file: str) -> Tuple[Any, Dict[str, str]]:
    """(tree, archive metadata) of a save of one item as one archive."""
    items, own = _encode_items(save_args, custom_metadata, file)
    ((tree, imd),) = items.values()
    leafless = imd[_L.KIND_KEY] in ("json", "stateful")
    return tree, {k: v for k, v in {**imd, **own}.items() if k != _L.KIND_KEY and (leafless or k != _LAYOUT_KEY)}


def _is_stateful(c: Any) -> bool:
    """Orbax's StatefulCheckpointable (``get_state()`` / ``set_state(state)``: a Grain iterator)."""
    return callable(getattr(c, "get_state", None)) and callable(getattr(c, "set_state", None))


#: Orbax's placeholder leaf (``...``): a target leaf that is not restored and comes back as ``...``.
PLACEHOLDER = ...


def _check_structure(path: str, sub: Optional[str], item: Any, *, extra_ok: bool, missing_ok: bool,
                     allow: str) -> None:
    """Orbax's structure rule for a restore into `item`, from the manifest alone (StructureError)."""
    with Where(path).open() as a:
        prefix = tuple(T.split_path(sub)) if sub else ()
        found = a.subtree(prefix)
        if found is None:
            raise NotFoundError(f"no item at '{sub}' in the checkpoint", file=path, key_path=sub or "")
        first, count, nodes = found
        start = T.index_treedef(nodes, path=prefix, first_leaf=first)
        pt = T.build(item, strict=False)
        flags = dict(T.box_components(pt))
        missing: List[str] = []
        used = set()
        for comps, leaf in T.iter_leaves(pt):
            if leaf.leaf_kind != T.DATA:
                if leaf.obj is PLACEHOLDER:
                    n = T.find_node(start, comps)
                    if n is not None:
                        used.update(range(n.first_leaf, n.first_leaf + n.num_leaves))
                continue
            idx = _R._resolve(start, comps, flags.get(comps, ())) if start is not None else None
            if idx is None:
                missing.append(T.join_path(prefix + comps))
            else:
                used.add(idx)
        extra = [a.leaf(i)["key_path"] for i in range(first, first + count) if i not in used]
    problems = []
    if extra and not extra_ok:
        problems.append(f"the target lacks {_count(extra, 'field')} the checkpoint holds: {_names(extra)} "
                        f"({allow[0]})")
    if missing and not missing_ok:
        problems.append(f"the checkpoint lacks {_count(missing, 'field')} the target has: {_names(missing)} "
                        f"({allow[1]})")
    if problems:
        raise StructureError("tree structures do not match, as Orbax refuses too: " + "; ".join(problems),
                             file=path, key_path=(extra if extra and not extra_ok else missing)[0])


def _count(xs: Sequence[str], what: str) -> str:
    return f"{len(xs)} {what}" + ("" if len(xs) == 1 else "s")


def _names(xs: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(repr(x) for x in xs[:limit])
    return shown + (f" and {len(xs) - limit} more" if len(xs) > limit else "")


# What permits each mismatch, by API (the message names it).
_ALLOW_V0 = ("PyTreeRestore(partial_restore=True) restores only the target's fields, and transforms={} "
             "(with restore_args) drops the others",
             "transforms={} (with restore_args) or PyTreeRestore(partial_restore=True) keeps the target's "
             "value there")


def _saved_sharding(info: Any) -> Any:
    """Where Orbax puts a leaf saved as a jax.Array without a target (None: NumPy, a 64-bit dtype without x64)."""
    jax = J.import_jax()
    dt = np.dtype(getattr(info, "dtype", None) or "float32")
    if dt.itemsize == 8 and dt.kind in "iuf" and not jax.config.jax_enable_x64:
        return None
    si = getattr(info, "sharding", None)
    if si is not None:
        try:
            return si.to_jax()
        except Exception:  # another device count: the default device, as Orbax falls back
            pass
    return jax.sharding.SingleDeviceSharding(jax.devices()[0])


def _resized_leaves(path: Where, sub: Optional[str], item: Any) -> Dict[str, Tuple[Any, Tuple[int, ...]]]:
    """{key path in the item: (target leaf, its shape)} of the array leaves whose shape differs from the saved one."""
    jax = J.import_jax()
    out: Dict[str, Tuple[Any, Tuple[int, ...]]] = {}
    with path.open() as a:
        for kp, leaf in jax.tree_util.tree_flatten_with_path(item)[0]:
            if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
                continue
            key = _key_path(kp)
            try:
                saved = tuple(a.info(_in_archive(sub, key)).shape)
            except Exception:  # not in the checkpoint: the structure rule says so
                continue
            if saved != tuple(leaf.shape):
                out[key] = (leaf, tuple(leaf.shape))
    return out


def _apply_transforms(path: Where, sub: Optional[str], item: Any, transforms: Mapping[str, Any]) -> Any:
    """The target `item` filled as Orbax's ``transforms`` say (:class:`Transform`)."""
    import re

    jax = J.import_jax()
    raw = path.load(subtree=sub)
    saved = {_key_path(kp): v for kp, v in jax.tree_util.tree_flatten_with_path(raw)[0]}
    rules = []
    for k, t in transforms.items():
        if not all(hasattr(t, f) for f in ("original_key", "use_fallback", "value_fn")):
            raise InvalidArgumentError(f"transforms[{k!r}] is a {type(t).__name__}, not an ocp.Transform",
                                       file=path, key_path=str(k))
        rules.append((re.compile(k), t))

    def one(kp: Any, leaf: Any) -> Any:
        key = _key_path(kp)
        for rx, t in rules:
            m = rx.fullmatch(key)
            if m is None:
                continue
            if getattr(t, "multi_value_fn", None) is not None:
                raise _unsupported("Transform(multi_value_fn=...)", "restore raw and combine the leaves", file=path)
            if getattr(t, "use_fallback", False) and key not in saved:
                return leaf
            src = m.expand(t.original_key) if getattr(t, "original_key", None) else key
            if src not in saved:
                raise NotFoundError(f"Transform: no leaf '{src}' in the checkpoint (for the target's '{key}')",
                                    file=path, key_path=src)
            v = saved[src]
            fn = getattr(t, "value_fn", None)
            return fn(v) if fn is not None else v
        return saved.get(key, leaf)

    return jax.tree_util.tree_map_with_path(one, item)


def _restore_pytree(path: str, sub: Optional[str], item: Any, restore_args: Any, transforms: Any,
                    partial_restore: bool = False, allow: Tuple[str, str] = _ALLOW_V0, jax_leaves: Sequence[str] = (),
                    resize: bool = False) -> Any:
    """One PyTree item (the subtree `sub`, or the root) as Orbax's PyTree handler restores it."""
    path = Where(path)
    flat: Dict[str, Any] = {}  # {key path: (Array)RestoreArgs} of the restore_args tree
    if restore_args is not None:
        if (jax := J.import_jax()) is None:
            raise _unsupported("restore_args", "they need jax")
        pairs, _ = jax.tree_util.tree_flatten_with_path(restore_args, is_leaf=_is_restore_arg)
        flat = {_key_path(p): ra for p, ra in pairs if _is_restore_arg(ra)}
    placed = {k: s for k, s in ((k, _sharding_of(ra)) for k, ra in flat.items()) if s is not None}
    if transforms and item is None:
        raise _unsupported("transforms without a target (item=)", "give the target tree the rules fill", file=path)
    jax_set = set(jax_leaves) if item is None else set()
    head = (sub + "/") if sub else ""

    def shardings(kp: str, info: Any) -> Any:  # kp: the leaf's key path in the archive
        k = kp[len(head):] if head and kp.startswith(head) else kp
        return placed[k] if k in placed else _saved_sharding(info) if k in jax_set else None

    use = shardings if (placed or jax_set) else None
    if transforms:
        tree = _apply_transforms(path, sub, item, transforms)
    elif item is None:
        tree = path.load(subtree=sub, shardings=use)
    else:
        fill = bool(partial_restore) or transforms is not None
        resized = _resized_leaves(path, sub, item) if resize else {}
        item = _read_later(item, resized)
        _check_structure(path, sub, item, extra_ok=fill, missing_ok=fill, allow=allow)
        tree = path.load(item, subtree=sub, shardings=use, cast=True, missing="from_like" if fill else "error")
        if resized:  # each read whole, cast, truncated or zero-padded and placed as its target
            jax = J.import_jax()

            def resized_leaf(a: Any, full: str, key: str) -> Any:
                target, shape = resized[key]
                v = np.asarray(a.read(full)).astype(target.dtype, copy=False)[tuple(slice(0, n) for n in shape)]
                v = np.pad(v, [(0, n - m) for n, m in zip(shape, v.shape)])  # cut, then zero-padded at the end
                s = getattr(target, "sharding", None)
                if J.is_jax_array(target) or J.is_shape_dtype_struct(target):
                    return jax.device_put(v, s) if s is not None else J.to_jax(v)
                return v
            tree = _fill_later(path, sub, tree, resized, resized_leaf)
    return _apply_leaf_args(tree, flat) if flat else tree


def _read_later(tree: Any, keys: Collection[str]) -> Any:
    """`tree` with the leaves at key paths `keys` as PLACEHOLDER (:func:`_fill_later` reads them)."""
    if not keys:
        return tree
    return J.import_jax().tree_util.tree_map_with_path(
        lambda kp, x: PLACEHOLDER if _key_path(kp) in keys else x, tree, is_leaf=lambda x: isinstance(x, type))


def _fill_later(path: Where, sub: Optional[str], tree: Any, keys: Collection[str],
                leaf: Callable[[Any, str, str], Any]) -> Any:
    """`tree` with each leaf at a key path of `keys` as ``leaf(archive, key path in it, key path in the item)``."""
    with path.open() as a:
        return J.import_jax().tree_util.tree_map_with_path(
            lambda kp, x: leaf(a, _in_archive(sub, _key_path(kp)), _key_path(kp)) if _key_path(kp) in keys else x,
            tree)


def _in_archive(sub: Optional[str], key: str) -> str:
    """Key path `key` of item `sub` (None: the root) in its archive."""
    return T.join_path([sub, key]) if sub and key else (sub or key)


def _tree_of(item: Any) -> Any:
    """A restore target; a TreeMetadata (treecask's or Orbax's) stands for its ``.tree``, as in Orbax."""
    return item.tree if any(c.__name__ in ("TreeMetadata", "_TreeMetadataImpl") for c in type(item).__mro__) else item


def _orbax_hint(path: Where) -> None:
    """InvalidArgumentError saying how to convert `path` when Orbax itself wrote it."""
    st, key = path.store, path.key
    head = stores.join(key, "") + "/" if key else ""
    try:
        names = set(st.list_prefix(head))
    except Exception:  # an unreachable store: the open that follows says so
        return
    if not any(stores.join(key, n) in names for n in ("_METADATA", "_CHECKPOINT_METADATA", "_sharding")):
        return
    parent = key.rpartition("/")[0]
    marks = [stores.join(key, "orbax.checkpoint"), stores.join(parent, "orbax.checkpoint")]
    v1 = marks[0] in names or marks[1] in st.list_prefix(marks[1])
    how = ("load it once with orbax.checkpoint.v1 and save the tree with treecask.orbax.v1 (treecask.import_orbax "
           "reads checkpoints of Orbax's v0 API)" if v1 else "convert it once with treecask.import_orbax(src, dst)")
    raise InvalidArgumentError("this is a checkpoint written by Orbax itself (a directory), not a treecask "
                               f"archive: {how}", file=path)


class Checkpoint:
    """A checkpoint as stored (one archive, or a directory of items), from its listing and metadata alone:
    ``md`` the archive's (or the directory index's) metadata, ``kinds`` each item's kind, ``default``
    whether it is one default item. Raises NotFoundError when there is none, InvalidArgumentError for a
    directory Orbax itself wrote."""

    def __init__(self, path: Any):
        self.where = w = Where(path)
        d = _L.directory_of(w.store, w.key)
        self._item_md: Dict[str, Dict[str, str]] = {}
        self.directory = d is not None
        if d is None:
            _orbax_hint(w)
            with w.open() as a:
                self.md = dict(a.metadata)
            self.default, self.kinds = _layout(self.md)
            return
        names, self.md = d
        self.kinds = {}
        for n in names:
            with self.item_where(n).open() as a:
                imd = dict(a.metadata)
            if imd.get(_L.KIND_KEY) == "metrics":  # a manager's step's metrics: not an item (Orbax's)
                continue
            self._item_md[n] = imd
            self.kinds[n] = imd.get(_L.KIND_KEY, "pytree")
        self.default = list(self.kinds) == [DEFAULT_ITEM_NAME] and _LAYOUT_KEY in self.md and _layout(self.md)[0]

    def item_where(self, name: str) -> Where:
        """Where item `name`'s archive is (the checkpoint's own for one archive)."""
        return Where(stores.join(self.where.key, name), self.where.store) if self.directory else self.where

    def item(self, name: str) -> Tuple[Where, Optional[str], Dict[str, str]]:
        """(archive, subtree key path or None for its root, archive metadata) of item `name`."""
        if self.directory:
            return self.item_where(name), None, self._item_md[name]
        return self.where, (None if self.default else T.escape_key(name)), self.md

    def json(self, name: str) -> Any:
        """The value of JSON item `name`."""
        return json.loads(self.item(name)[2][_JSON_PREFIX + name])

    def jax_leaves(self, name: str) -> List[str]:
        """The key paths (in item `name`) of the leaves saved as jax arrays."""
        return json.loads(self.item(name)[2].get(_JAX_PREFIX + name) or "[]")

    def set_state(self, name: str, obj: Any) -> Any:
        """Stateful item `name`'s saved state set into `obj` (InvalidArgumentError without ``set_state``)."""
        if not _is_stateful(obj):
            raise InvalidArgumentError(f"item '{name}' is a stateful checkpointable (e.g. a Grain iterator): to "
                                       "restore it, pass an instance of the object to restore into",
                                       file=self.item_where(name))
        obj.set_state(json.loads(self.item(name)[2][_STATE_PREFIX + name]))
        return obj

    def custom_metadata(self) -> Any:
        """The save's custom_metadata, or None."""
        return json.loads(self.md[_CUSTOM_KEY]) if _CUSTOM_KEY in self.md else None


def _restore_item(ck: Checkpoint, name: str, ra: Any) -> Any:
    """Item `name` of checkpoint `ck` restored with its restore argument `ra` (or None: as saved)."""
    saved = ck.kinds[name]
    at, sub, md = ck.item(name)
    op, k = args.kind(ra) if ra is not None else ("restore", saved)
    if ra is not None and op != "restore":
        raise InvalidArgumentError(f"item '{name}': Orbax restore arguments expected, got {k}", file=at)
    if saved == "stateful":
        return ck.set_state(name, getattr(ra, "item", None))
    if saved == "json" or k == "json":
        if saved != k:
            raise InvalidArgumentError(f"item '{name}' was saved as {saved}, restored as {k}", file=at)
        return ck.json(name)
    names = {c.__name__ for c in type(ra).__mro__}
    if "StandardRestoreArgs" in names:
        if getattr(ra, "support_layout", False) or getattr(ra, "fallback_sharding", None) is not None:
            raise _unsupported("StandardRestore(support_layout / fallback_sharding)",
                               "a target without a sharding restores onto the current mesh or NumPy", file=at)
        return _restore_pytree(at, sub, _tree_of(ra.item), None, None, resize=not getattr(ra, "strict", True))
    if getattr(ra, "legacy_transform_fn", None) is not None:
        raise _unsupported("PyTreeRestore(legacy_transform_fn=...)", "restore raw and transform", file=at)
    # (ra None: as saved; ArrayRestore's restore_args is one RestoreArgs: the leaf at the item's root, key path "")
    return _restore_pytree(at, sub, _tree_of(getattr(ra, "item", None)), getattr(ra, "restore_args", None),
                           getattr(ra, "transforms", None), bool(getattr(ra, "partial_restore", False)),
                           jax_leaves=ck.jax_leaves(name))


def _restore(path: Any, ra: Any) -> Any:
    """A checkpoint restored with a restore argument (None: every item as saved)."""
    ck = Checkpoint(path)
    want: Dict[str, Any]
    if ra is not None and args.kind(ra)[1] == "composite":
        want = args.composite_items(ra)
        if ck.default and set(want) != {DEFAULT_ITEM_NAME}:
            raise NotFoundError(f"the checkpoint holds one item ('{DEFAULT_ITEM_NAME}'), not {sorted(want)}",
                                file=ck.where)
    elif ck.default:
        return _restore_item(ck, DEFAULT_ITEM_NAME, ra)
    elif ra is None:
        want = {n: None for n in ck.kinds}
    elif len(ck.kinds) == 1:  # a directory of one item: Orbax restores it with the item's own arguments
        return _restore_item(ck, next(iter(ck.kinds)), ra)
    else:
        raise InvalidArgumentError(f"the checkpoint holds items {sorted(ck.kinds)}: restore with "
                                   "args=Composite(name=...)", file=ck.where)
    out = {}
    for name, item_ra in want.items():
        if name not in ck.kinds:
            raise NotFoundError(f"no item '{name}' in the checkpoint (it holds {sorted(ck.kinds)})", file=ck.where)
        out[name] = _restore_item(ck, name, item_ra)
    return args.Composite(**out)


# ---------------------------------------------------------------- item metadata


def _tree_metadata(at: Where, sub: Optional[str], custom: Any) -> TreeMetadata:
    """The TreeMetadata of the PyTree at `sub` (None: the root) of archive `at`, from its manifest."""
    with at.open() as a:
        prefix = tuple(T.split_path(sub)) if sub else ()
        found = a.subtree(prefix)
        if found is None:
            return TreeMetadata(None, custom)
        first, count, nodes = found
        values = [_leaf_metadata(a.info(i)) for i in range(first, first + count)]
        return TreeMetadata(_R._assemble(a, nodes, first, values, prefix), custom)


def _item_metadata(path: Any) -> Any:
    """A checkpoint's item metadata: a TreeMetadata, or a Composite of them (None for JSON items)."""
    ck = path if isinstance(path, Checkpoint) else Checkpoint(path)
    custom = ck.custom_metadata()
    out = {n: None if k in ("json", "stateful") else _tree_metadata(*ck.item(n)[:2], custom)
           for n, k in ck.kinds.items()}
    return out[DEFAULT_ITEM_NAME] if ck.default else args.Composite(**out)
