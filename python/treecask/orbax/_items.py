"""How ``treecask.orbax`` keeps Orbax's checkpoints in treecask archives:
Orbax's per-leaf arguments (``SaveArgs``, ``RestoreArgs``,
``ArrayRestoreArgs``) and the functions behind ``utils.to_shape_dtype_struct``
and ``checkpoint_utils.construct_restore_args``; Orbax's structure rule for a
restore into a target (``_check_structure``); the items of a checkpoint (one PyTree at the archive
root, or several named PyTree, JSON and array items under their names, with
the layout in the archive metadata) encoded for :func:`treecask.save` and
restored by :func:`treecask.load`; and a checkpoint's item metadata, read from
the manifest alone. The checkpointers (``_checkpointers.py``) and the
manager (``__init__.py``) save and restore through these.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .. import _jaxutil as J
from . import args as args
from .. import _restore as _R
from .. import _tree as T
from .. import stores
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


class Where(str):
    """Where a checkpoint is: the text every message shows for it (a file
    path, or a URL with its secrets redacted: ``Store.display``), a str,
    that also carries its store and its path inside it
    (``treecask.stores.resolve``), through which it is read and written.
    ``Where(directory, store=None)``: ``directory`` inside ``store``, or a
    file path or URL; a Where is returned as it is."""

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

    def local(self) -> Optional[str]:
        """Its file system path, in a store the core maps; else None."""
        return self.store.local_path(self.key)


def _unsupported(feature: str, why: str, file: str = "") -> UnsupportedError:
    return UnsupportedError(f"Orbax {feature} is not supported by treecask.orbax: {why}", file=file)


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


def _is_restore_arg(x: Any) -> bool:
    """A RestoreArgs / ArrayRestoreArgs, treecask's or Orbax's."""
    return not isinstance(x, type) and hasattr(x, "restore_type") and hasattr(x, "dtype")


def _is_array_restore_arg(x: Any) -> bool:
    return _is_restore_arg(x) and (hasattr(x, "sharding") or hasattr(x, "mesh"))


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


def _flat_restore_args(restore_args: Any) -> Dict[str, Any]:
    """{treecask key path: (Array)RestoreArgs} of a restore_args tree."""
    jax = J.import_jax()
    if jax is None:
        raise _unsupported("restore_args", "they need jax")
    pairs, _ = jax.tree_util.tree_flatten_with_path(restore_args, is_leaf=_is_restore_arg)
    return {_key_path(p): ra for p, ra in pairs if _is_restore_arg(ra)}


def _apply_save_args(item: Any, save_args: Any) -> Any:
    """`item` with each leaf whose SaveArgs has a dtype cast to it."""
    if save_args is None:
        return item
    jax = J.import_jax()
    if jax is None:
        return item
    leaves = jax.tree_util.tree_leaves(save_args, is_leaf=lambda x: hasattr(x, "aggregate"))
    if not any(getattr(sa, "dtype", None) is not None for sa in leaves):
        return item

    def cast(x, sa):
        dt = getattr(sa, "dtype", None)
        if dt is None or not hasattr(x, "astype") or getattr(x, "dtype", None) == dt:
            return x
        return x.astype(dt)

    return jax.tree_util.tree_map(cast, item, save_args, is_leaf=lambda x: hasattr(x, "aggregate"))


def _apply_leaf_args(tree: Any, flat: Mapping[str, Any]) -> Any:
    """Each leaf of `tree` converted as its RestoreArgs says (dtype, restore_type)."""
    jax = J.import_jax()
    leaf_types = (np.ndarray, np.generic)

    def convert(path, v):
        ra = flat.get(_key_path(path))
        if ra is None or not (isinstance(v, leaf_types) or J.is_jax_array(v)):
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
        if (rt is jax.Array or (rt is None and _is_array_restore_arg(ra))) and not J.is_jax_array(v):
            return J.to_jax(v)
        return v

    return jax.tree_util.tree_map_with_path(convert, tree)


def _to_shape_dtype_struct(x: Any, dtype: Any = None, scalar_dtype: Any = None, sharding: Any = None) -> Any:
    """``jax.ShapeDtypeStruct`` of an array, ``ShapeDtypeStruct`` or
    :class:`ArrayMetadata` (its shape, its dtype or ``dtype``, its sharding
    or ``sharding``; an ArrayMetadata's recorded NamedSharding rebuilt over
    the current devices); a Python scalar as is, or converted by
    ``scalar_dtype``; a :class:`StringMetadata` as ``""`` (Orbax
    ``utils.to_shape_dtype_struct``)."""
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
    """A tree of restore arguments from a target (Orbax
    ``checkpoint_utils.construct_restore_args``): a jax array or
    ``ShapeDtypeStruct`` -> :class:`ArrayRestoreArgs` on its sharding (or
    ``sharding_tree``'s), with its dtype (and shape: ``set_global_shape``); a
    NumPy array -> ``RestoreArgs(restore_type=np.ndarray, dtype)``; other
    leaves -> ``RestoreArgs(restore_type=type(leaf))``."""
    jax = J.import_jax()

    def one(x, s=None):
        if J.is_jax_array(x) or J.is_shape_dtype_struct(x):
            return ArrayRestoreArgs(restore_type=jax.Array, dtype=x.dtype,
                                    sharding=s if s is not None else getattr(x, "sharding", None),
                                    global_shape=tuple(x.shape) if set_global_shape else None)
        if isinstance(x, np.ndarray):
            return RestoreArgs(restore_type=np.ndarray, dtype=x.dtype)
        return RestoreArgs(restore_type=type(x))

    if sharding_tree is None:
        return jax.tree_util.tree_map(one, target)
    return jax.tree_util.tree_map(one, target, sharding_tree)


# ---------------------------------------------------------------- items in an archive


def _layout(md: Mapping[str, str]) -> Tuple[bool, Dict[str, str]]:
    """(default-item mode, {item name: kind}) of a step from its archive metadata."""
    raw = md.get(_LAYOUT_KEY)
    if raw is None:
        return True, {DEFAULT_ITEM_NAME: "pytree"}
    d = json.loads(raw)
    return bool(d["default"]), dict(d["items"])


def _encode(save_args: Any, custom_metadata: Any, file: str) -> Tuple[Any, Dict[str, str], bool]:
    """(tree, archive metadata, default-item mode) of a save's argument."""
    op, kind = args.kind(save_args)
    if kind == "composite":
        items, default = args.composite_items(save_args), False
        if not items:
            raise InvalidArgumentError("Composite() holds no item to save", file=file)
    elif op == "save":
        items, default = {DEFAULT_ITEM_NAME: save_args}, True
    else:
        raise InvalidArgumentError(f"save needs Orbax save arguments (args.StandardSave(...)...), got {kind}",
                                   file=file)
    tree: Dict[str, Any] = {}
    md: Dict[str, str] = {}
    kinds: Dict[str, str] = {}
    custom = custom_metadata
    for name, a in items.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"an item name is a non-empty str, got {name!r}", file=file)
        op, k = args.kind(a)
        if op != "save":
            raise InvalidArgumentError(f"item '{name}': Orbax save arguments expected, got {k}", file=file)
        kinds[name] = k
        if k == "json":
            try:
                md[_JSON_PREFIX + name] = json.dumps(a.item)
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"item '{name}' (JsonSave) is not JSON-serialisable: {e}",
                                           file=file) from None
        else:
            tree[name] = _apply_save_args(a.item, getattr(a, "save_args", None))
            if getattr(a, "custom_metadata", None) is not None and custom is None:
                custom = a.custom_metadata
    if custom is not None:
        md[_CUSTOM_KEY] = json.dumps(custom)
    if default and kinds[DEFAULT_ITEM_NAME] != "json":
        return tree[DEFAULT_ITEM_NAME], md, True  # one PyTree at the root: what treecask.load reads
    md[_LAYOUT_KEY] = json.dumps({"default": default, "items": kinds}, sort_keys=True)
    return (tree or None), md, default


#: Orbax's placeholder leaf (``...``): a target leaf that is not restored and comes back as ``...``.
PLACEHOLDER = ...


def _check_structure(path: str, sub: Optional[str], item: Any, *, extra_ok: bool, missing_ok: bool,
                     allow: str) -> None:
    """Orbax's structure rule for a restore into the target `item`, from the
    manifest alone (no array bytes read): raises StructureError naming the key
    paths of the checkpoint's leaves the target lacks (unless `extra_ok`) and
    of the target's leaves the checkpoint lacks (unless `missing_ok`); `allow`
    says what permits each. A target leaf ``...`` (PLACEHOLDER) covers the
    checkpoint's leaves at and under its key path. Leaves are matched as
    treecask.load matches them (a Flax box and its bare value are one leaf)."""
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


def _restore_pytree(path: str, sub: Optional[str], item: Any, restore_args: Any, transforms: Any,
                    partial_restore: bool = False, allow: Tuple[str, str] = _ALLOW_V0,
                    fill_missing: Optional[bool] = None) -> Any:
    """One PyTree item (the subtree `sub`, or the root) as Orbax's PyTree handler
    restores it. With a target, the structures must agree (Orbax's rule,
    _check_structure) unless `partial_restore` (the checkpoint's other fields
    are not read; a target field it lacks keeps the target's value) or
    `transforms` (``{}``: the same, as Orbax's default-to-original rule) say
    otherwise; `fill_missing` False refuses a target field the checkpoint
    lacks even then. A target leaf ``...`` is not read and comes back as ``...``."""
    if transforms:
        raise _unsupported("transforms with rules", "only transforms={} (fill the target's new leaves "
                           "from the target) is; restore raw and rearrange", file=path)
    flat = _flat_restore_args(restore_args) if restore_args is not None else {}
    placed = {k: s for k, s in ((k, _sharding_of(ra)) for k, ra in flat.items()) if s is not None}
    shardings = (lambda kp, info: placed.get(kp)) if placed else None
    if item is None:
        tree = Where(path).load(subtree=sub, shardings=shardings)
    else:
        lenient = bool(partial_restore) or transforms is not None
        fill = lenient if fill_missing is None else bool(fill_missing)
        _check_structure(path, sub, item, extra_ok=lenient, missing_ok=fill, allow=allow)
        tree = Where(path).load(item, subtree=sub, shardings=shardings, cast=True,
                     missing="from_like" if fill else "error")
    return _apply_leaf_args(tree, flat) if flat else tree


def _tree_of(item: Any) -> Any:
    """A restore target; a TreeMetadata (treecask's or Orbax's, e.g. of
    ShapeDtypeStructs) stands for its ``.tree``, as Orbax restores it."""
    if any(c.__name__ in ("TreeMetadata", "_TreeMetadataImpl") for c in type(item).__mro__):
        return item.tree
    return item


def _restore_item(path: str, md: Mapping[str, str], name: str, saved: str, default: bool, ra: Any) -> Any:
    """Item `name` (saved as kind `saved`) restored with its restore argument `ra` (or None: raw)."""
    op, k = args.kind(ra) if ra is not None else ("restore", saved)
    if ra is not None and op != "restore":
        raise InvalidArgumentError(f"item '{name}': Orbax restore arguments expected, got {k}", file=path)
    if saved == "json" or k == "json":
        if saved != k:
            raise InvalidArgumentError(f"item '{name}' was saved as {saved}, restored as {k}", file=path)
        return json.loads(md[_JSON_PREFIX + name])
    sub = None if default else T.escape_key(name)
    if ra is None:
        return _restore_pytree(path, sub, None, None, None)
    names = {c.__name__ for c in type(ra).__mro__}
    if "StandardRestoreArgs" in names:
        if not getattr(ra, "strict", True):
            raise _unsupported("StandardRestore(strict=False)", "shapes must equal the saved ones", file=path)
        if getattr(ra, "support_layout", False) or getattr(ra, "fallback_sharding", None) is not None:
            raise _unsupported("StandardRestore(support_layout / fallback_sharding)",
                               "a target without a sharding restores onto the current mesh or NumPy", file=path)
        return _restore_pytree(path, sub, _tree_of(ra.item), None, None)
    if getattr(ra, "legacy_transform_fn", None) is not None:
        raise _unsupported("PyTreeRestore(legacy_transform_fn=...)", "restore raw and transform", file=path)
    # (ArrayRestore's restore_args is one RestoreArgs: the leaf at the item's root, key path "")
    return _restore_pytree(path, sub, _tree_of(ra.item), getattr(ra, "restore_args", None),
                           getattr(ra, "transforms", None), bool(getattr(ra, "partial_restore", False)))


def _orbax_hint(path: str) -> None:
    """Raises InvalidArgumentError saying how to convert it when `path` is a
    checkpoint directory written by Orbax itself: treecask.import_orbax for
    Orbax's v0 API; for its v1 API (an ``orbax.checkpoint`` marker file in the
    checkpoint directory), which import_orbax does not read, a load with
    Orbax's v1 and a save with treecask.orbax.v1. (Orbax writes such
    directories on a file system; only a store the core maps is looked at.)"""
    local = Where(path).local()
    if local is None:
        return
    if os.path.isdir(local) and any(os.path.exists(os.path.join(local, n))
                                    for n in ("_METADATA", "_CHECKPOINT_METADATA", "_sharding")):
        if any(os.path.isfile(os.path.join(d, "orbax.checkpoint")) for d in (local, os.path.dirname(local))):
            how = ("load it once with orbax.checkpoint.v1 and save the tree with treecask.orbax.v1 "
                   "(treecask.import_orbax reads checkpoints of Orbax's v0 API)")
        else:
            how = "convert it once with treecask.import_orbax(src, dst)"
        raise InvalidArgumentError("this is a checkpoint written by Orbax itself (a directory), not a treecask "
                                   f"archive: {how}", file=path)


def _restore(path: Any, ra: Any) -> Any:
    """A checkpoint (one archive; a :class:`Where`, or a path or URL) restored
    with a restore argument (None: every item raw)."""
    path = Where(path)
    _orbax_hint(path)
    with path.open() as a:
        md = dict(a.metadata)
    default, kinds = _layout(md)
    want: Dict[str, Any]
    if ra is not None and args.kind(ra)[1] == "composite":
        want = args.composite_items(ra)
        if default and set(want) != {DEFAULT_ITEM_NAME}:
            raise NotFoundError(f"the checkpoint holds one item ('{DEFAULT_ITEM_NAME}'), not {sorted(want)}",
                                file=path)
    elif default:
        return _restore_item(path, md, DEFAULT_ITEM_NAME, kinds[DEFAULT_ITEM_NAME], True, ra)
    elif ra is None:
        want = {n: None for n in kinds}
    else:
        raise InvalidArgumentError(f"the checkpoint holds items {sorted(kinds)}: restore with "
                                   "args=Composite(name=...)", file=path)
    out = {}
    for name, item_ra in want.items():
        if name not in kinds:
            raise NotFoundError(f"no item '{name}' in the checkpoint (it holds {sorted(kinds)})", file=path)
        out[name] = _restore_item(path, md, name, kinds[name], default, item_ra)
    return args.Composite(**out)


# ---------------------------------------------------------------- item metadata


def _item_metadata(path: Any) -> Any:
    """A checkpoint's item metadata (``path``: a :class:`Where`, or a path or
    URL): a TreeMetadata (one item) or a Composite of them (None for JSON items)."""
    path = Where(path)
    _orbax_hint(path)
    with path.open() as a:
        md = dict(a.metadata)
        default, kinds = _layout(md)
        custom = json.loads(md[_CUSTOM_KEY]) if _CUSTOM_KEY in md else None
        out = {}
        for name, kind in kinds.items():
            if kind == "json":
                out[name] = None
                continue
            prefix = () if default else (name,)
            sub = a.subtree(prefix)
            if sub is None:
                out[name] = TreeMetadata(None, custom)
                continue
            first, count, nodes = sub
            values = [_leaf_metadata(a.info(i)) for i in range(first, first + count)]
            out[name] = TreeMetadata(_R._assemble(a, nodes, first, values, prefix), custom)
    return out[DEFAULT_ITEM_NAME] if default else args.Composite(**out)


# The classes are treecask.orbax's, where users import them from (repr, pickles, help).
for _cls in (SaveArgs, RestoreArgs, ArrayRestoreArgs):
    _cls.__module__ = "treecask.orbax"
del _cls
