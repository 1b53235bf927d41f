"""``treecask.orbax.args``: Orbax's ``ocp.args`` classes, the arguments of a
save or restore (``StandardSave``, ``StandardRestore``, ``PyTreeSave``,
``PyTreeRestore``, ``Composite``, ``JsonSave``, ``JsonRestore``,
``ArraySave``, ``ArrayRestore``).

Each class has the name, fields and defaults of orbax-checkpoint 0.12's
(``StandardSave`` is ``StandardSaveArgs``...), so code written for
``orbax.checkpoint.args`` builds them unchanged. They only carry arguments:
``treecask.orbax`` reads them (and Orbax's own instances, recognised by their
class names) and saves and restores through treecask archives. What an
argument asks for that treecask cannot do raises ``UnsupportedError`` when
the save or restore runs, naming the Orbax argument.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

__all__ = ["CheckpointArgs", "StandardSave", "StandardRestore", "PyTreeSave", "PyTreeRestore", "JsonSave",
           "JsonRestore", "ArraySave", "ArrayRestore", "Composite"]


class CheckpointArgs:
    """Base class of every save / restore argument (Orbax's ``CheckpointArgs``)."""


@dataclasses.dataclass
class StandardSaveArgs(CheckpointArgs):
    """Save a pytree of arrays and scalars (Orbax ``args.StandardSave``).

    ``item``: the tree (every leaf :func:`treecask.save` takes). ``save_args``:
    optional tree of ``SaveArgs`` with ``item``'s structure; a ``dtype`` there
    casts that leaf before saving (Orbax's rule); ``aggregate``,
    ``chunk_byte_size`` and ``shard_axes`` are storage tuning of Orbax's
    TensorStore layout and have no effect on an archive. ``custom_metadata``:
    a JSON-serialisable value stored with the step.
    """

    item: Any
    save_args: Optional[Any] = None
    custom_metadata: Optional[Any] = None


@dataclasses.dataclass
class StandardRestoreArgs(CheckpointArgs):
    """Restore a pytree (Orbax ``args.StandardRestore``).

    ``item``: None (the tree as saved, leaves saved as jax arrays restored as
    jax arrays, as Orbax), or a target: a tree of arrays or
    ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of the state). With a target
    each leaf comes back as the target's type, on the target's sharding, cast
    to the target's dtype (Orbax casts; a float64 checkpoint restores into a
    float32 target). Shapes must agree (``ShapeError``, "shape mismatch"),
    and structures (Orbax's rule: ``StructureError`` naming every checkpoint
    field the target lacks and every target field the checkpoint lacks; use
    :class:`PyTreeRestoreArgs` with ``partial_restore=True`` to restore a part).
    ``strict=False`` (Orbax pads or truncates to another shape),
    ``support_layout`` and ``fallback_sharding`` raise ``UnsupportedError``.
    """

    item: Optional[Any] = None
    strict: bool = True
    support_layout: bool = False
    fallback_sharding: Optional[Any] = None


@dataclasses.dataclass
class PyTreeSaveArgs(CheckpointArgs):
    """Save a pytree (Orbax ``args.PyTreeSave``): as :class:`StandardSaveArgs`;
    ``ocdbt_target_data_file_size`` (OCDBT tuning) is accepted and ignored."""

    item: Any
    save_args: Optional[Any] = None
    ocdbt_target_data_file_size: Optional[int] = None
    custom_metadata: Optional[Any] = None


@dataclasses.dataclass
class PyTreeRestoreArgs(CheckpointArgs):
    """Restore a pytree (Orbax ``args.PyTreeRestore``).

    ``item``: None or a target tree (as :class:`StandardRestoreArgs`).
    ``restore_args``: optional tree of ``RestoreArgs`` / ``ArrayRestoreArgs``
    (treecask's or Orbax's, e.g. from ``flax.training.orbax_utils.
    restore_args_from_target``) with the target's (or the checkpoint's)
    structure: ``sharding`` (or ``mesh`` + ``mesh_axes``) places the array on
    devices, each device reading only its box; ``dtype`` casts it;
    ``restore_type=np.ndarray`` returns a NumPy array. The target's structure
    must equal the checkpoint's (Orbax's rule; ``StructureError`` naming the
    key paths) unless ``partial_restore=True`` (only the target's fields are
    read; a target field the checkpoint lacks keeps the target's value, a
    ``ShapeDtypeStruct`` there raises ``StructureError``) or
    ``transforms={}`` (the same: Orbax's "fill new fields from the target");
    non-empty transforms and ``legacy_transform_fn`` raise
    ``UnsupportedError``. A target leaf ``...`` (``PLACEHOLDER``) is not read.
    """

    item: Optional[Any] = None
    restore_args: Optional[Any] = None
    transforms: Optional[Any] = None
    transforms_default_to_original: bool = True
    legacy_transform_fn: Optional[Any] = None
    partial_restore: bool = False


@dataclasses.dataclass
class JsonSaveArgs(CheckpointArgs):
    """Save a JSON-serialisable value (Orbax ``args.JsonSave``): stored as JSON
    text in the step archive's metadata; restored by :class:`JsonRestoreArgs`
    as ``json.loads`` gives it (tuples become lists)."""

    item: Any


@dataclasses.dataclass
class JsonRestoreArgs(CheckpointArgs):
    """Restore a JSON item (Orbax ``args.JsonRestore``); ``item`` is ignored."""

    item: Optional[Any] = None


@dataclasses.dataclass
class ArraySaveArgs(CheckpointArgs):
    """Save one array (Orbax ``args.ArraySave``), as a pytree of one leaf."""

    item: Any
    save_args: Optional[Any] = None


@dataclasses.dataclass
class ArrayRestoreArgs(CheckpointArgs):
    """Restore one array (Orbax ``args.ArrayRestore``): ``item`` a target array
    or ``ShapeDtypeStruct``, ``restore_args`` one ``RestoreArgs`` /
    ``ArrayRestoreArgs``."""

    item: Optional[Any] = None
    restore_args: Optional[Any] = None


class CompositeArgs(CheckpointArgs, collections.abc.Mapping):
    """Several named items in one step (Orbax ``args.Composite``):
    ``Composite(state=StandardSave(s), meta=JsonSave(m))``. Also what a
    composite restore returns: item name -> restored item, read as
    ``result.state`` or ``result["state"]``. Item names are non-empty str
    (``InvalidArgumentError`` otherwise, when saved)."""

    def __init__(self, **items: Any):
        object.__setattr__(self, "_items", dict(items))

    def __getattr__(self, name: str) -> Any:
        items = object.__getattribute__(self, "_items")
        if name in items:
            return items[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Composite is immutable")

    def __getitem__(self, name: str) -> Any:
        return self._items[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CompositeArgs) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"Composite({self._items!r})"


# Orbax's short names.
StandardSave, StandardRestore, PyTreeSave, PyTreeRestore, Composite = (
    StandardSaveArgs, StandardRestoreArgs, PyTreeSaveArgs, PyTreeRestoreArgs, CompositeArgs)
JsonSave, JsonRestore, ArraySave, ArrayRestore = JsonSaveArgs, JsonRestoreArgs, ArraySaveArgs, ArrayRestoreArgs


def kind(a: Any) -> Tuple[str, str]:
    """(``"save"`` or ``"restore"``, item kind: ``"pytree"``, ``"json"``,
    ``"array"``, ``"composite"``) of an argument object, treecask's or
    Orbax's (by class name along its MRO); ("", type name) when unknown."""
    for cls in type(a).__mro__:
        k = _KINDS.get(cls.__name__)
        if k is not None and (k[1] != "array" or hasattr(a, "item")):  # not the per-leaf ArrayRestoreArgs
            return k
    return "", type(a).__name__


_KINDS: Dict[str, Tuple[str, str]] = {
    "StandardSaveArgs": ("save", "pytree"), "PyTreeSaveArgs": ("save", "pytree"),
    "StandardRestoreArgs": ("restore", "pytree"), "PyTreeRestoreArgs": ("restore", "pytree"),
    "JsonSaveArgs": ("save", "json"), "JsonRestoreArgs": ("restore", "json"),
    "ArraySaveArgs": ("save", "array"), "ArrayRestoreArgs": ("restore", "array"),
    "CompositeArgs": ("", "composite"),
}


def composite_items(a: Any) -> Mapping[str, Any]:
    """The items of a Composite (treecask's or Orbax's: both are mappings)."""
    return dict(a.items())
