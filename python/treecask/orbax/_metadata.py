"""``treecask.orbax``'s metadata classes (Orbax's), read from manifests without array bytes."""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Optional, Tuple

import numpy as np

from .. import _jaxutil as J


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
        self.tree, self.custom_metadata = tree, custom_metadata
        jax = J.jax_loaded()  # registered as a jax pytree once jax is loaded (never imports jax)
        if jax is not None and not _REGISTERED:
            _REGISTERED.append(True)
            jax.tree_util.register_pytree_with_keys_class(TreeMetadata)

    # A jax pytree whose children are the top level of `tree` (as Orbax's), so that
    # jax.tree.map(ocp.utils.to_shape_dtype_struct, metadata) gives a restore target.
    def tree_flatten_with_keys(self):
        jtu = J.import_jax().tree_util
        t = self.tree
        if isinstance(t, dict):
            return [(jtu.DictKey(k), t[k]) for k in t], (dict, list(t), self.custom_metadata)
        if isinstance(t, (list, tuple)):
            return [(jtu.SequenceKey(i), v) for i, v in enumerate(t)], (type(t), len(t), self.custom_metadata)
        return [(jtu.GetAttrKey("tree"), t)], (None, None, self.custom_metadata)

    def tree_flatten(self):
        pairs, aux = self.tree_flatten_with_keys()
        return [v for _, v in pairs], aux

    @classmethod
    def tree_unflatten(cls, aux, children):
        kind, keys, custom = aux  # kind: dict, the list or tuple type (a namedtuple's fields positional), or None
        return cls(dict(zip(keys, children)) if kind is dict else children[0] if kind is None else
                   kind(children) if kind in (list, tuple) else kind(*children), custom)

    def __getitem__(self, k: Any) -> Any:
        return self.tree[k]

    def __iter__(self):
        return iter(self.tree if isinstance(self.tree, dict) else ())

    def __len__(self) -> int:
        return len(self.tree) if isinstance(self.tree, dict) else 0

    def __repr__(self) -> str:
        return f"TreeMetadata(tree={self.tree!r}, custom_metadata={self.custom_metadata!r})"


_REGISTERED = []


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
