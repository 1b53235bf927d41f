"""``treecask.orbax``: Orbax's checkpointing API over treecask archives.

    import treecask.orbax as ocp          # instead of: import orbax.checkpoint as ocp

The names and signatures are orbax-checkpoint 0.12's, both the legacy API of
the Flax guide (``PyTreeCheckpointer``, ``CheckpointManager(dir, checkpointer,
options)``, ``save_kwargs={'save_args': ...}``, ``restore(..., item=target,
restore_args=..., transforms={})``, ``AsyncCheckpointer``) and today's
(``CheckpointManager(dir, options=CheckpointManagerOptions(...))``,
``save(step, args=ocp.args.StandardSave(state))``, ``restore(step,
args=ocp.args.StandardRestore(abstract))``, ``ocp.args.Composite``,
``item_metadata``). Underneath, every checkpoint is a treecask archive written
by :func:`treecask.save` (a checkpointer's ``directory`` is one archive file)
and a manager is a :class:`treecask.CheckpointManager` (one archive per step,
``step_<n>.cask``), read back by :func:`treecask.load`: the archives are
ordinary ones that ``treecask.load`` / ``treecask.open`` read.

Orbax's semantics are kept where users notice them: with ``best_fn`` and
``max_to_keep`` the manager keeps exactly the ``max_to_keep`` best steps
(``treecask.CheckpointManager`` keeps the newest too); a restore into a target
casts each leaf to the target's dtype (``treecask.load(cast=True)``).
What treecask does not do raises :class:`treecask.UnsupportedError` naming
the Orbax feature. Orbax itself is not needed; its own argument objects
(``ocp.args.StandardSave``, ``RestoreArgs`` from ``flax.training.orbax_utils``,
handlers, options) are accepted by their class names and fields.
docs/python.md "Switching from Orbax in one line" lists what differs.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import os
import pathlib
import threading
from typing import Any, Callable, Container, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from . import _jaxutil as J
from . import _manager as _M
from . import _remote
from . import _ocp_args as args
from . import _ocp_args as _args  # for methods whose parameter `args` (Orbax's name) hides the module
from . import _restore as _R
from . import _tree as T
from ._open import load as _load
from ._open import open as _open
from ._save import save as _save
from .errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, UnsupportedError

__all__ = [
    "args",
    "SaveArgs",
    "RestoreArgs",
    "ArrayRestoreArgs",
    "AsyncOptions",
    "CheckpointManagerOptions",
    "CheckpointManager",
    "Checkpointer",
    "AsyncCheckpointer",
    "PyTreeCheckpointer",
    "StandardCheckpointer",
    "CheckpointHandler",
    "PyTreeCheckpointHandler",
    "StandardCheckpointHandler",
    "JsonCheckpointHandler",
    "ArrayCheckpointHandler",
    "CompositeCheckpointHandler",
    "ArrayMetadata",
    "ScalarMetadata",
    "StringMetadata",
    "TreeMetadata",
    "StepMetadata",
    "RootMetadata",
    "DEFAULT_ITEM_NAME",
    "utils",
    "checkpoint_utils",
]

#: The item name of a checkpoint of one item (Orbax's).
DEFAULT_ITEM_NAME = "default"

# Archive metadata of a step written by this module (a step without it is one
# PyTree item at the archive root, as treecask.CheckpointManager writes).
_LAYOUT_KEY = "treecask.orbax.items"  # JSON {"default": bool, "items": {name: "pytree"|"json"|"array"}}
_JSON_PREFIX = "treecask.orbax.json/"  # + item name: a JSON item's text
_CUSTOM_KEY = "treecask.orbax.custom_metadata"  # JSON of save(custom_metadata=...)


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
            return jax.numpy.asarray(v)
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


class utils:  # noqa: N801 - Orbax's module name
    """``ocp.utils``: the helpers of Orbax's that guides call."""

    to_shape_dtype_struct = staticmethod(_to_shape_dtype_struct)


class checkpoint_utils:  # noqa: N801 - Orbax's module name
    """``ocp.checkpoint_utils``: ``construct_restore_args``."""

    construct_restore_args = staticmethod(_construct_restore_args)


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


def _restore_pytree(path: str, sub: Optional[str], item: Any, restore_args: Any, transforms: Any) -> Any:
    """One PyTree item (the subtree `sub`, or the root) as Orbax's PyTree handler restores it."""
    if transforms:
        raise _unsupported("transforms with rules", "only transforms={} (fill the target's new leaves "
                           "from the target) is; restore raw and rearrange", file=path)
    flat = _flat_restore_args(restore_args) if restore_args is not None else {}
    placed = {k: s for k, s in ((k, _sharding_of(ra)) for k, ra in flat.items()) if s is not None}
    shardings = (lambda kp, info: placed.get(kp)) if placed else None
    if item is None:
        tree = _load(path, subtree=sub, shardings=shardings)
    else:
        tree = _load(path, item, subtree=sub, shardings=shardings, cast=True,
                     missing="error" if transforms is None else "from_like")
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
    return _restore_pytree(path, sub, _tree_of(ra.item), getattr(ra, "restore_args", None), getattr(ra, "transforms", None))


def _orbax_hint(path: str) -> None:
    """Raises InvalidArgumentError pointing to treecask.import_orbax when `path`
    is a checkpoint directory written by Orbax itself."""
    if os.path.isdir(path) and any(os.path.exists(os.path.join(path, n))
                                   for n in ("_METADATA", "_CHECKPOINT_METADATA", "_sharding")):
        raise InvalidArgumentError("this is a checkpoint written by Orbax itself (a directory), not a treecask "
                                   "archive: convert it once with treecask.import_orbax(src, dst)", file=path)


def _restore(path: str, ra: Any) -> Any:
    """A checkpoint (one archive) restored with a restore argument (None: every item raw)."""
    _orbax_hint(path)
    with _open(path) as a:
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


# ---------------------------------------------------------------- metadata


@dataclasses.dataclass
class ArrayMetadata:
    """An array leaf's metadata (Orbax ``ArrayMetadata``): its key path
    ``name``, ``shape``, NumPy ``dtype`` and, when it was saved with a
    ``NamedSharding``, ``sharding`` (a ``treecask.ShardingInfo``; its
    ``to_jax()`` rebuilds the NamedSharding). No bytes are read to make it."""

    name: str
    shape: Tuple[int, ...]
    dtype: np.dtype
    sharding: Optional[Any] = None


@dataclasses.dataclass
class ScalarMetadata(ArrayMetadata):
    """A Python int / float / bool leaf's metadata (Orbax ``ScalarMetadata``)."""


@dataclasses.dataclass
class StringMetadata:
    """A str leaf's metadata (Orbax ``StringMetadata``)."""

    name: str


class TreeMetadata(collections.abc.Mapping):
    """What ``item_metadata`` returns for a PyTree item (Orbax ``TreeMetadata``):
    ``.tree``, the item's tree (dicts, lists, tuples, as ``treecask.load``
    without a target builds it) of :class:`ArrayMetadata` /
    :class:`ScalarMetadata` / :class:`StringMetadata` leaves, and
    ``.custom_metadata`` (the save's ``custom_metadata``, or None). It is also
    a mapping over ``.tree`` when that is a dict (``metadata["params"]``)."""

    def __init__(self, tree: Any, custom_metadata: Any = None):
        self.tree = tree
        self.custom_metadata = custom_metadata
        _register_tree_metadata()

    # A jax pytree whose children are the top level of `tree` (as Orbax's), so that
    # jax.tree.map(ocp.utils.to_shape_dtype_struct, metadata) gives a restore target.
    def tree_flatten_with_keys(self):
        jtu = J.import_jax().tree_util
        t = self.tree
        if isinstance(t, dict):
            keys = list(t)
            return [(jtu.DictKey(k), t[k]) for k in keys], (dict, keys, self.custom_metadata)
        if isinstance(t, (list, tuple)):
            return [(jtu.SequenceKey(i), v) for i, v in enumerate(t)], (type(t), len(t), self.custom_metadata)
        return [(jtu.GetAttrKey("tree"), t)], (None, None, self.custom_metadata)

    def tree_flatten(self):
        pairs, aux = self.tree_flatten_with_keys()
        return [v for _, v in pairs], aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        kind, keys, custom = aux
        if kind is dict:
            tree = dict(zip(keys, children))
        elif kind is not None:
            tree = kind(children) if kind in (list, tuple) else kind(*children)
        else:
            tree = children[0]
        return cls(tree, custom)

    def __getitem__(self, k: Any) -> Any:
        return self.tree[k]

    def __iter__(self):
        return iter(self.tree if isinstance(self.tree, dict) else ())

    def __len__(self) -> int:
        return len(self.tree) if isinstance(self.tree, dict) else 0

    def __repr__(self) -> str:
        return f"TreeMetadata(tree={self.tree!r}, custom_metadata={self.custom_metadata!r})"


_REGISTERED = []


def _register_tree_metadata() -> None:
    """Registers TreeMetadata as a jax pytree once jax is loaded (never imports jax)."""
    jax = J.jax_loaded()
    if jax is not None and not _REGISTERED:
        _REGISTERED.append(True)
        jax.tree_util.register_pytree_with_keys_class(TreeMetadata)


@dataclasses.dataclass
class StepMetadata:
    """A checkpoint's (or a manager step's) metadata (Orbax ``StepMetadata``):
    ``item_metadata`` (a :class:`TreeMetadata`, or a Composite of them and
    None for JSON items), ``metrics`` (the step's, or None) and
    ``custom_metadata`` (the save's ``custom_metadata``, or None)."""

    item_metadata: Any
    metrics: Optional[Any] = None
    custom_metadata: Optional[Any] = None


@dataclasses.dataclass
class RootMetadata:
    """A manager's metadata (Orbax ``RootMetadata``): ``custom_metadata``, the
    ``metadata=`` given to a manager of the directory (kept in each step it saves)."""

    custom_metadata: Optional[Any] = None


def _leaf_metadata(info: Any) -> Any:
    if info.value_kind == "str":
        return StringMetadata(info.key_path)
    cls = ScalarMetadata if info.value_kind in ("int", "float", "bool") else ArrayMetadata
    return cls(info.key_path, tuple(info.shape), info.dtype, info.sharding)


def _item_metadata(path: str) -> Any:
    """A checkpoint's item metadata: a TreeMetadata (one item) or a Composite of them (None for JSON items)."""
    _orbax_hint(path)
    with _open(path) as a:
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


# ---------------------------------------------------------------- handlers


class CheckpointHandler:
    """Base of the handlers (Orbax ``CheckpointHandler``): a handler names the
    kind of item a checkpointer saves and the argument classes its legacy
    positional calls build. Orbax's own handler objects are accepted wherever
    these are (by class name). Constructor options of Orbax's handlers
    (``use_ocdbt``, ``use_zarr3``, ``save_concurrent_gb``...) tune Orbax's
    storage: accepted, no effect."""

    kind = "pytree"
    save_args_cls: Any = args.PyTreeSave
    restore_args_cls: Any = args.PyTreeRestore

    def __init__(self, *unused: Any, **orbax_options: Any):
        del unused, orbax_options

    def close(self) -> None:
        """Nothing to release (Orbax API)."""


class PyTreeCheckpointHandler(CheckpointHandler):
    """A pytree of arrays and scalars (Orbax ``PyTreeCheckpointHandler``):
    ``save(dir, item, save_args=...)``, ``restore(dir, item=..., restore_args=..., transforms=...)``."""


class StandardCheckpointHandler(CheckpointHandler):
    """A pytree (Orbax ``StandardCheckpointHandler``): ``args.StandardSave`` / ``args.StandardRestore``."""

    save_args_cls = args.StandardSave
    restore_args_cls = args.StandardRestore


class JsonCheckpointHandler(CheckpointHandler):
    """A JSON value (Orbax ``JsonCheckpointHandler``; ``filename`` is ignored)."""

    kind = "json"
    save_args_cls = args.JsonSave
    restore_args_cls = args.JsonRestore


class ArrayCheckpointHandler(CheckpointHandler):
    """One array (Orbax ``ArrayCheckpointHandler``)."""

    kind = "array"
    save_args_cls = args.ArraySave
    restore_args_cls = args.ArrayRestore


class CompositeCheckpointHandler(CheckpointHandler):
    """Several named items (Orbax ``CompositeCheckpointHandler``): save and
    restore with ``args=args.Composite(...)``."""

    kind = "composite"
    save_args_cls = args.Composite
    restore_args_cls = args.Composite


_HANDLERS = {c.__name__: c for c in (PyTreeCheckpointHandler, StandardCheckpointHandler, JsonCheckpointHandler,
                                     ArrayCheckpointHandler, CompositeCheckpointHandler)}


def _handler_class(h: Any) -> type:
    """This module's handler class for a handler (instance or class, this module's or Orbax's)."""
    cls = h if isinstance(h, type) else type(h)
    for c in cls.__mro__:
        if c.__name__ in _HANDLERS:
            return _HANDLERS[c.__name__]
    raise _unsupported(f"handler {cls.__name__}", f"the handlers are {sorted(_HANDLERS)}")


def _build_args(handler: type, op: str, pos: Tuple[Any, ...], kw: Dict[str, Any]) -> Any:
    """The argument object of a checkpointer call: ``args=`` as given, or
    (legacy) the handler's argument class built from the other arguments."""
    if "args" in kw:
        a = kw.pop("args")
        if pos or kw:
            raise TypeError(f"{op}: pass args= alone, not with {sorted(kw) or 'positional arguments'}")
        return a
    if op == "restore" and not pos and not kw:
        return None
    cls = handler.save_args_cls if op == "save" else handler.restore_args_cls
    return cls(*pos, **kw)


# ---------------------------------------------------------------- checkpointers


class Checkpointer:
    """Saves and restores one checkpoint at a path (Orbax ``Checkpointer``).

    ``Checkpointer(handler)``; the checkpoint at ``directory`` is one treecask
    archive *file* (Orbax writes a directory there), written atomically by
    :func:`treecask.save` (parent directories are created). Options of Orbax's
    constructor (``multiprocessing_options``, ``file_options``,
    ``atomicity_options``...) are accepted and have no effect.

    ``save(directory, *args, force=False, custom_metadata=None, **kwargs)``:
    ``args=ocp.args.StandardSave(tree)`` (today's API) or the handler's legacy
    arguments, e.g. ``save(path, tree, save_args=...)``. An existing
    checkpoint raises ``AlreadyExistsError`` (a ``FileExistsError``; Orbax
    raises ValueError) unless ``force=True``, which replaces it.

    ``restore(directory, *args, **kwargs)``: ``args=...`` or the legacy
    ``item=target, restore_args=..., transforms=...``; nothing: the tree as
    saved (dicts, lists and tuples of NumPy arrays and Python scalars; Orbax
    gives ``jax.Array`` for leaves saved as jax arrays). Raises
    ``NotFoundError`` (a ``FileNotFoundError``) when there is no checkpoint,
    ``ShapeError`` when a target's shape differs, ``StructureError`` when the
    target has a leaf the checkpoint lacks (unless ``transforms={}``).
    """

    _async = False

    def __init__(self, handler: Any = None, *, multiprocessing_options: Any = None, file_options: Any = None,
                 atomicity_options: Any = None, checkpoint_metadata_store: Any = None,
                 temporary_path_class: Any = None, **orbax_options: Any):
        self._handler = _handler_class(handler if handler is not None else PyTreeCheckpointHandler)
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()

    @property
    def handler(self) -> Any:
        """The handler class this checkpointer saves with."""
        return self._handler

    def save(self, directory: Any, *args_: Any, force: bool = False, custom_metadata: Any = None,
             **kwargs: Any) -> None:
        """Saves a checkpoint at ``directory`` (class docstring)."""
        path = os.fspath(directory)
        a = _build_args(self._handler, "save", args_, kwargs)
        tree, md, _ = _encode(a, custom_metadata, path)
        self.wait_until_finished()
        if _remote.is_url(path) or _M._jax_processes()[1] > 1:
            # An object in a store (committed whole or not at all), or a multi-process save (a
            # sharded checkpoint directory, swapped in atomically by force): treecask.save's rules.
            _save(path, tree, metadata=md, overwrite=bool(force))
            return
        if os.path.lexists(path):
            if not force:
                raise AlreadyExistsError("a checkpoint exists here (force=True replaces it)", file=path)
            _M._remove_entry(path)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if not self._async:
            _save(path, tree, metadata=md)
            return
        pending = _M._save_async(path, tree, metadata=md)  # returns once the bytes are safe

        def finish() -> None:
            try:
                pending.wait()
            except BaseException as e:  # raised by the next call
                with self._lock:
                    self._error = e

        self._thread = threading.Thread(target=finish, name="treecask-orbax-save", daemon=False)
        self._thread.start()

    def restore(self, directory: Any, *args_: Any, **kwargs: Any) -> Any:
        """Restores the checkpoint at ``directory`` (class docstring)."""
        self.wait_until_finished()
        return _restore(os.fspath(directory), _build_args(self._handler, "restore", args_, kwargs))

    def metadata(self, directory: Any) -> "StepMetadata":
        """The checkpoint's :class:`StepMetadata` (``.item_metadata`` a
        :class:`TreeMetadata`; no array bytes read)."""
        self.wait_until_finished()
        path = os.fspath(directory)
        im = _item_metadata(path)
        return StepMetadata(im, None, getattr(im, "custom_metadata", None))

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight (asynchronous checkpointers) is
        durable; raises its error, once."""
        t = self._thread
        if t is not None:
            t.join()
            self._thread = None
        self.check_for_errors()

    def check_for_errors(self) -> None:
        """Raises the error of a finished asynchronous save, once (never blocks)."""
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def close(self) -> None:
        """Waits for the save in flight."""
        self.wait_until_finished()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncCheckpointer(Checkpointer):
    """A :class:`Checkpointer` whose ``save`` returns once the tree's bytes
    are safe from the caller (Orbax ``AsyncCheckpointer``): NumPy leaves are
    copied into a host snapshot, jax.Array leaves held as read-only views
    (treecask's asynchronous save); writing, fsync and the atomic rename run
    in the background. ``wait_until_finished()`` blocks until durable and
    raises a background error; the next ``save``, ``restore`` or ``close``
    waits first. ``timeout_secs`` and ``async_options`` are accepted and have
    no effect (the wait is until done). A save to an object-store URL, or in
    a multi-process jax job, runs synchronously (``treecask.save``'s upload
    and cross-process commit); a manager's steps are asynchronous there too."""

    _async = True

    def __init__(self, handler: Any = None, timeout_secs: Optional[int] = None, *, async_options: Any = None,
                 **orbax_options: Any):
        super().__init__(handler, **orbax_options)


class PyTreeCheckpointer(Checkpointer):
    """``Checkpointer(PyTreeCheckpointHandler())`` (Orbax ``PyTreeCheckpointer``,
    synchronous): ``save(path, tree, save_args=...)``, ``restore(path, item=...,
    restore_args=..., transforms=...)``. ``use_ocdbt``, ``use_zarr3``,
    ``use_compression``, ``primary_host`` are accepted, no effect."""

    def __init__(self, primary_host: Optional[int] = 0, use_ocdbt: bool = True, use_zarr3: bool = False,
                 use_compression: bool = True):
        super().__init__(PyTreeCheckpointHandler)


class StandardCheckpointer(AsyncCheckpointer):
    """An asynchronous checkpointer of a pytree (Orbax ``StandardCheckpointer``):
    ``save(path, state, *, save_args=None, force=False, custom_metadata=None)``,
    ``restore(path, target=None, *, strict=True)`` (a target of arrays or
    ``ShapeDtypeStruct``: their types, shardings and dtypes, leaves cast)."""

    def __init__(self, **orbax_options: Any):
        super().__init__(StandardCheckpointHandler)

    def save(self, directory: Any, state: Any = None, *, save_args: Any = None, force: bool = False,
             custom_metadata: Any = None, args: Any = None) -> None:  # noqa: A002 - Orbax's name
        """Saves ``state`` at ``directory`` (see :class:`Checkpointer`)."""
        a = args if args is not None else _args.StandardSave(state, save_args=save_args)
        super().save(directory, args=a, force=force, custom_metadata=custom_metadata)

    def restore(self, directory: Any, target: Any = None, *, strict: bool = True,
                args: Any = None) -> Any:  # noqa: A002
        """Restores the checkpoint at ``directory``, into ``target`` when given."""
        a = args if args is not None else _args.StandardRestore(target, strict=strict)
        return super().restore(directory, args=a)


def _is_async(checkpointer: Any) -> bool:
    return any(c.__name__ == "AsyncCheckpointer" for c in type(checkpointer).__mro__)


# ---------------------------------------------------------------- manager


@dataclasses.dataclass
class AsyncOptions:
    """Orbax ``AsyncOptions``: accepted, no effect (a wait lasts until the save is done)."""

    timeout_secs: int = 600
    barrier_sync_fn: Optional[Any] = None
    post_finalization_callback: Optional[Callable[[], None]] = None
    create_directories_asynchronously: bool = False


@dataclasses.dataclass
class CheckpointManagerOptions:
    """Orbax ``CheckpointManagerOptions``, field for field.

    Followed: ``save_interval_steps``, ``save_on_steps``, ``should_save_fn``,
    ``max_to_keep``, ``keep_period``, ``best_fn``, ``best_mode`` (with
    ``best_fn`` exactly the ``max_to_keep`` best steps are kept, as Orbax),
    ``enable_async_checkpointing``, ``read_only``, ``prevent_write_metrics``.
    Always true in treecask, so accepted: ``create``, ``cleanup_tmp_directories``,
    ``enable_background_delete``, ``keep_checkpoints_without_metrics=True``.
    No effect: ``async_options``, ``multiprocessing_options``, ``file_options``,
    ``atomicity_options`` (a step is always committed by an atomic rename),
    ``save_root_metadata``, ``num_deletion_threads``, ``lightweight_initialize``,
    ``enable_should_save_is_saving_in_progress_check``,
    ``enable_per_process_directory_creation``. ``UnsupportedError`` from the
    manager when set: ``keep_time_interval``, ``keep_checkpoints_without_metrics=False``,
    ``step_prefix``, ``step_format_fixed_length``, ``step_name_format`` (steps
    are ``step_<8+ digits>.cask``), ``single_host_load_and_broadcast``,
    ``todelete_subdir``, ``todelete_full_path``, ``save_decision_policy``,
    ``preservation_policy``, ``temporary_path_class``.
    """

    save_interval_steps: int = 1
    max_to_keep: Optional[int] = None
    keep_time_interval: Optional[Any] = None
    keep_period: Optional[int] = None
    best_fn: Optional[Callable[[Any], float]] = None
    best_mode: str = "max"
    keep_checkpoints_without_metrics: bool = True
    step_prefix: Optional[str] = None
    step_format_fixed_length: Optional[int] = None
    step_name_format: Optional[Any] = None
    create: bool = True
    cleanup_tmp_directories: bool = False
    save_on_steps: Optional[Container[int]] = None
    single_host_load_and_broadcast: bool = False
    todelete_subdir: Optional[str] = None
    todelete_full_path: Optional[str] = None
    enable_background_delete: bool = False
    num_deletion_threads: Optional[int] = None
    read_only: bool = False
    enable_async_checkpointing: bool = True
    async_options: Optional[Any] = None
    multiprocessing_options: Optional[Any] = None
    should_save_fn: Optional[Callable[[int, Optional[int]], bool]] = None
    file_options: Optional[Any] = None
    atomicity_options: Optional[Any] = None
    save_root_metadata: bool = True
    temporary_path_class: Optional[Any] = None
    save_decision_policy: Optional[Any] = None
    preservation_policy: Optional[Any] = None
    prevent_write_metrics: bool = False
    enable_should_save_is_saving_in_progress_check: bool = True
    enable_per_process_directory_creation: bool = False
    lightweight_initialize: bool = False

    def __post_init__(self) -> None:
        if self.best_mode not in ("min", "max"):
            raise ValueError(f"CheckpointManagerOptions.best_mode must be 'min' or 'max', got {self.best_mode!r}")


# (option, value that is supported, why another is not)
_UNSUPPORTED_OPTIONS = (
    ("keep_time_interval", None, "retention is by count (max_to_keep), keep_period and best_fn"),
    ("keep_checkpoints_without_metrics", True, "treecask always keeps steps saved without metrics"),
    ("step_prefix", None, "steps are named step_<8+ digits>.cask"),
    ("step_format_fixed_length", None, "steps are named step_<8+ digits>.cask"),
    ("step_name_format", None, "steps are named step_<8+ digits>.cask"),
    ("single_host_load_and_broadcast", False, "every process reads what it needs"),
    ("todelete_subdir", None, "retention deletes steps"),
    ("todelete_full_path", None, "retention deletes steps"),
    ("save_decision_policy", None, "use save_interval_steps, save_on_steps or should_save_fn"),
    ("preservation_policy", None, "use max_to_keep, keep_period, best_fn"),
    ("temporary_path_class", None, "a step is committed by an atomic rename"),
)


class CheckpointManager:
    """A directory of checkpoint steps (Orbax ``CheckpointManager``) over a
    :class:`treecask.CheckpointManager`: one treecask archive per step,
    ``<directory>/step_<n>.cask``, holding the step's items, metrics and
    custom metadata; ``treecask.load`` reads a step directly.

    Both of Orbax's constructors:

    - today's: ``CheckpointManager(directory, options=..., item_names=...,
      item_handlers=..., metadata=...)``; ``save(step, args=ocp.args.StandardSave(s),
      metrics=m)``, ``restore(step, args=ocp.args.StandardRestore(abstract))``,
      several items with ``args=ocp.args.Composite(state=..., meta=ocp.args.JsonSave(...))``;
    - the legacy one: ``CheckpointManager(directory, checkpointer, options)``
      (one item) or ``CheckpointManager(directory, {name: checkpointer}, options)``;
      ``save(step, items, save_kwargs={'save_args': ...})``,
      ``restore(step, items=target, restore_kwargs={'restore_args': ...,
      'transforms': {}})``. An ``AsyncCheckpointer`` makes saves asynchronous.

    Retention, listing and saving follow Orbax (:class:`CheckpointManagerOptions`):
    with ``best_fn``, exactly the ``max_to_keep`` best steps (a new step worse
    than those is deleted at once). ``save`` returns False for a step that is
    not due (``should_save``: a step above the latest, on the interval or in
    ``save_on_steps``, or ``should_save_fn``) unless ``force=True``; a step that
    exists raises ``AlreadyExistsError``. Saves are asynchronous by default
    (``enable_async_checkpointing``): ``save`` returns once the bytes are safe
    (NumPy leaves copied, jax.Array leaves held), ``wait_until_finished()``
    makes them durable. ``all_steps()`` and ``latest_step()`` include a step
    still being saved (Orbax's bookkeeping).

    Raises (constructor): ``UnsupportedError`` for the options treecask does
    not implement (named), ``handler_registry``; ``ValueError`` for
    ``checkpointers`` combined with ``item_names`` / ``item_handlers``.
    """

    def __init__(self, directory: Any, checkpointers: Any = None, options: Any = None,
                 metadata: Optional[Mapping[str, Any]] = None, item_names: Optional[Sequence[str]] = None,
                 item_handlers: Any = None, logger: Any = None, handler_registry: Any = None):
        opts = options if options is not None else CheckpointManagerOptions()
        d = os.fspath(directory)
        for name, ok, why in _UNSUPPORTED_OPTIONS:
            v = getattr(opts, name, ok)
            if v != ok:
                raise _unsupported(f"CheckpointManagerOptions({name}={v!r})", why, file=d)
        if handler_registry is not None:
            raise _unsupported("handler_registry", "name the items' handlers with item_handlers", file=d)
        if checkpointers is not None and (item_names is not None or item_handlers is not None):
            raise ValueError("`checkpointers` cannot be combined with `item_names` or `item_handlers`")
        self._opts = opts
        self._handlers: Dict[str, type] = {}
        self._default: Optional[bool] = None  # default-item mode, once known
        if checkpointers is not None:  # the legacy API
            if isinstance(checkpointers, Mapping):
                self._default = False
                self._handlers = {n: _handler_class(getattr(c, "handler", c)) for n, c in checkpointers.items()}
                async_save = any(_is_async(c) for c in checkpointers.values())
            else:
                self._default = True
                self._handlers = {DEFAULT_ITEM_NAME: _handler_class(getattr(checkpointers, "handler", checkpointers))}
                async_save = _is_async(checkpointers)
        else:
            async_save = bool(getattr(opts, "enable_async_checkpointing", True))
            if isinstance(item_handlers, Mapping):
                self._default = False
                self._handlers = {n: _handler_class(h) for n, h in item_handlers.items()}
            elif item_handlers is not None:
                self._default = True
                self._handlers = {DEFAULT_ITEM_NAME: _handler_class(item_handlers)}
            if item_names is not None:
                self._default = False
                for n in item_names:
                    self._handlers.setdefault(n, PyTreeCheckpointHandler)
        self._root_metadata = dict(metadata) if metadata is not None else None
        self._legacy = checkpointers is not None
        self._mgr = _M.CheckpointManager(
            d, max_to_keep=None if getattr(opts, "read_only", False) else getattr(opts, "max_to_keep", None),
            keep_period=getattr(opts, "keep_period", None), best_fn=getattr(opts, "best_fn", None),
            best_mode=getattr(opts, "best_mode", "max"), keep_newest=False, save_interval_steps=1,
            async_save=async_save)

    # ---- listing ----
    @property
    def directory(self) -> pathlib.Path:
        """The directory of the steps (a URL string for an object store)."""
        return self._mgr.directory

    def _in_flight(self) -> Optional[int]:
        job = self._mgr._job
        return job.step if job is not None and not job.done.is_set() else None

    def all_steps(self, read: bool = False) -> List[int]:
        """The steps, ascending: the directory's, plus a step still being saved."""
        steps = set(self._mgr.all_steps())
        s = self._in_flight()
        if s is not None:
            steps.add(s)
        return sorted(steps)

    def latest_step(self) -> Optional[int]:
        """The highest step (one being saved included), or None."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def best_step(self) -> Optional[int]:
        """With ``best_fn``: the best step among those saved with metrics; else the latest."""
        self._mgr._join()
        return self._mgr.best_step()

    def reload(self) -> None:
        """Nothing to do: every listing reads the directory (Orbax API)."""

    def reached_preemption(self, step: int) -> bool:
        """False: treecask does not watch for preemption notices (Orbax API)."""
        return False

    def should_save(self, step: int) -> bool:
        """Whether ``save(step)`` writes (Orbax's rule): not read-only, ``step``
        above the latest step, and ``should_save_fn(step, latest)`` if given,
        else ``step % save_interval_steps == 0`` or ``step in save_on_steps``."""
        o = self._opts
        if getattr(o, "read_only", False):
            return False
        fn = getattr(o, "should_save_fn", None)
        if fn is None:  # the step's schedule first: a step that is not due lists nothing (a bucket: no request)
            interval = getattr(o, "save_interval_steps", 1)
            on_steps = getattr(o, "save_on_steps", None)
            if not ((interval and step % interval == 0) or (on_steps and step in on_steps)):
                return False
        last = self.latest_step()
        if last is not None and last >= step:
            return False
        return fn is None or bool(fn(step, last))

    # ---- save ----
    def _legacy_save_args(self, items: Any, save_kwargs: Any) -> Any:
        if self._default is not False:
            h = self._handlers.get(DEFAULT_ITEM_NAME, PyTreeCheckpointHandler)
            return h.save_args_cls(items, **(save_kwargs or {}))
        if not isinstance(items, Mapping):
            raise InvalidArgumentError("this manager holds items "
                                       f"{sorted(self._handlers)}: save a dict of them", file=str(self.directory))
        out = {}
        for name, item in items.items():
            h = self._handlers.get(name)
            if h is None:
                raise InvalidArgumentError(f"no checkpointer for item '{name}'", file=str(self.directory))
            out[name] = h.save_args_cls(item, **((save_kwargs or {}).get(name) or {}))
        return args.Composite(**out)

    def save(self, step: int, items: Any = None, save_kwargs: Any = None, metrics: Any = None,
             force: Optional[bool] = False, args: Any = None,  # noqa: A002 - Orbax's name
             custom_metadata: Optional[Mapping[str, Any]] = None) -> bool:
        """Saves step ``step`` (class docstring); True when saved (or, asynchronous,
        snapshotted), False when not due.

        Raises ValueError when neither ``args`` nor ``items`` is given;
        ``AlreadyExistsError`` for an existing step; what ``treecask.save``
        raises for a leaf it cannot store; the error of the previous
        asynchronous save."""
        if items is None and args is None:
            raise ValueError("Must provide `args` for `save`.")
        a = args if args is not None else self._legacy_save_args(items, save_kwargs)
        if not force and not self.should_save(step):
            return False
        tree, md, default = _encode(a, custom_metadata, str(self.directory))
        if self._default is None:
            self._default = default
        if self._root_metadata is not None:
            md["treecask.orbax.root_metadata"] = json.dumps(self._root_metadata)
        if getattr(self._opts, "prevent_write_metrics", False):
            metrics = None
        return self._mgr.save(step, tree, metrics=metrics, force=True, metadata=md)

    # ---- restore ----
    def _step_path(self, step: Optional[int], directory: Any) -> str:
        if directory is None:
            self._mgr._join()
            if step is None:
                step = self._mgr.latest_step()
            if step is None:
                hint = ""
                if self._mgr._bucket is None and any(n.isdigit() for n in os.listdir(self._mgr.directory)):
                    hint = (": its numbered entries look like steps written by Orbax itself; convert one with "
                            "treecask.import_orbax(directory, dst, step=N)")
                raise NotFoundError("no steps found" + hint, file=str(self.directory))
            if step not in self._mgr._steps():
                raise NotFoundError(f"no step {step} in the directory", file=str(self.directory))
            return str(self._mgr.path(step))
        steps = _M.list_steps(directory)
        if step is None:
            step = max(steps) if steps else None
        if step is None or step not in steps:
            raise NotFoundError(f"no step {step} in the directory", file=os.fspath(directory))
        return os.path.join(os.fspath(directory), steps[step])

    def _legacy_restore_args(self, items: Any, restore_kwargs: Any) -> Any:
        if items is None and not restore_kwargs:
            return None
        if self._default is not False:
            h = self._handlers.get(DEFAULT_ITEM_NAME, PyTreeCheckpointHandler)
            return h.restore_args_cls(items, **(restore_kwargs or {}))
        items = items or {}
        restore_kwargs = restore_kwargs or {}
        out = {}
        for name in set(items) | set(restore_kwargs):
            h = self._handlers.get(name, PyTreeCheckpointHandler)
            out[name] = h.restore_args_cls(items.get(name), **(restore_kwargs.get(name) or {}))
        return args.Composite(**out)

    def restore(self, step: Optional[int], items: Any = None, restore_kwargs: Any = None,
                directory: Any = None, args: Any = None) -> Any:  # noqa: A002
        """Restores ``step`` (None: the latest) from this directory or ``directory``.

        One item: that item (raw, or into the target as the restore argument
        says); several: an ``args.Composite`` of the items asked for (all of
        them, raw, without ``args``). A save in flight is waited for first.
        Raises ``NotFoundError`` (a ``FileNotFoundError``) for a missing step
        or item; ``ShapeError`` / ``StructureError`` as :class:`Checkpointer`."""
        a = args if args is not None else self._legacy_restore_args(items, restore_kwargs)
        return _restore(self._step_path(step, directory), a)

    def item_metadata(self, step: int) -> Any:
        """The step's item metadata, no array bytes read: a :class:`TreeMetadata`
        (one item) or an ``args.Composite`` of them (None for JSON items)."""
        if step is None:
            raise ValueError("`step` must be provided")
        return _item_metadata(self._step_path(step, None))

    def metrics(self, step: int) -> Optional[Any]:
        """The metrics saved with ``step``, or None."""
        self._mgr._join()
        return self._mgr.metrics(step)

    def metadata(self, step: Optional[int] = None) -> Any:
        """``step`` None: a :class:`RootMetadata`, the manager's ``metadata``
        (or the latest step's record of it) as ``.custom_metadata``; a step:
        its :class:`StepMetadata`."""
        if step is None:
            custom = self._root_metadata
            latest = self._mgr.latest_step()
            if custom is None and latest is not None:
                with _open(self._step_path(latest, None)) as a:
                    raw = a.metadata.get("treecask.orbax.root_metadata")
                custom = json.loads(raw) if raw is not None else None
            return RootMetadata(custom)
        path = self._step_path(step, None)
        with _open(path) as a:
            raw = a.metadata.get(_CUSTOM_KEY)
        return StepMetadata(_item_metadata(path), self.metrics(step),
                            json.loads(raw) if raw is not None else None)

    def delete(self, step: int) -> None:
        """Deletes ``step``. Raises NotFoundError when it does not exist."""
        self._mgr._join()
        listing = self._mgr._steps()
        if step not in listing:
            raise NotFoundError(f"no step {step} in the directory", file=str(self.directory))
        self._mgr._remove(listing[step])

    # ---- lifetime ----
    def is_saving_in_progress(self) -> bool:
        """Whether an asynchronous save is still running."""
        return self._in_flight() is not None

    def check_for_errors(self) -> None:
        """Raises the error of a finished asynchronous save, once, without blocking."""
        if self._in_flight() is None:
            err = self._mgr._take_error()
            if err is not None:
                raise err

    def wait_until_finished(self) -> None:
        """Blocks until the save in flight is durable and retention has run;
        raises its error, once."""
        self._mgr.wait_until_finished()

    def close(self) -> None:
        """Waits for the save in flight, then closes (later saves raise)."""
        self._mgr.close()

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<treecask.orbax.CheckpointManager {str(self.directory)!r}>"
