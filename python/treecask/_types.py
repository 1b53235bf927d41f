"""The public value types: LeafInfo (what the manifest says about one leaf),
ShardingInfo, TreeNode (one treedef node) and SaveStats.

The classes' ``__module__`` is ``treecask``, where users import them from, so
that a pickle names ``treecask.LeafInfo`` whatever private module defines it
(pickles written before they moved here name ``treecask._archive.LeafInfo``,
which still resolves: ``_archive.py`` imports them). Their annotations are
objects, not strings (no ``from __future__ import annotations``), so
``typing.get_type_hints`` needs no names from that module.
"""

import math
import os
from dataclasses import dataclass
from typing import Any, Dict, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _codec, _dtypes
from . import _jaxutil as J
from .errors import InvalidArgumentError

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class ShardingInfo:
    """How a leaf was sharded when saved: a mesh (axis names and sizes) and a
    PartitionSpec with, per dimension, the mesh axes that shard it."""

    mesh_axis_names: Tuple[str, ...]
    mesh_axis_sizes: Tuple[int, ...]
    spec: Tuple[Tuple[str, ...], ...]

    def partition_spec(self):
        """The spec as a ``jax.sharding.PartitionSpec`` (imports jax)."""
        import jax

        return jax.sharding.PartitionSpec(*J.lists_to_spec(self.spec))

    def to_jax(self, devices: Optional[Sequence[Any]] = None):
        """A ``jax.sharding.NamedSharding`` over a mesh of the saved shape built
        from ``devices`` (default: all devices; their count must equal the
        product of the mesh axis sizes, else InvalidArgumentError)."""
        import jax

        devs = list(devices) if devices is not None else jax.devices()
        n = math.prod(self.mesh_axis_sizes)
        if len(devs) != n:
            raise InvalidArgumentError(
                f"the saved mesh has {n} devices, {len(devs)} were given")
        mesh = jax.sharding.Mesh(np.array(devs).reshape(self.mesh_axis_sizes), self.mesh_axis_names)
        return jax.sharding.NamedSharding(mesh, self.partition_spec())


class ShardBox(NamedTuple):
    """One saved box of a leaf of a sharded checkpoint (format 3.0, SPEC.md
    "Checkpoint directories"): the elements ``[start, stop)`` of the global
    array, one element index per dimension in each, stored as the leaf
    ``key_path`` of the shard ``file`` (a file name in the checkpoint
    directory)."""

    file: str
    key_path: str
    start: Tuple[int, ...]
    stop: Tuple[int, ...]


@dataclass(frozen=True)
class LeafInfo:
    """What the manifest says about one leaf.

    ``key_path`` and ``index`` (its position in pre-order) name the leaf;
    ``dtype`` is the NumPy / ml_dtypes dtype (``dtype_name`` the format's name),
    ``shape`` the array shape (for a ``str`` leaf: its UTF-8 byte count),
    ``value_kind`` what the saving program had ("array", "int", "float",
    "bool", "str"), ``codec`` "none" (stored raw) or "lz4" (whether a leaf is
    read as a view of the map: ``zero_copy``), ``filter`` "none" or "shuffle"
    (bytes shuffled before LZ4; format 2.0, SPEC.md "Filters"),
    ``byte_length`` the leaf's bytes as stored uncompressed (packed for the
    sub-byte dtypes), ``stored_bytes`` bytes in the file, ``chunk_size`` raw
    bytes per chunk, ``num_chunks`` and ``num_parts`` its chunks and zero-copy
    parts (SPEC.md "Large leaves"; 0 for a sharded leaf, whose bytes are in
    other files), ``logical_axes`` one name per dimension ("" unnamed) or
    empty, ``sharding`` the mesh and PartitionSpec it was saved with or None,
    ``metadata`` the leaf's user key-values. ``shards``: for a leaf of a
    sharded checkpoint (:class:`treecask.ShardedArchive`), the saved boxes
    it is assembled from (ShardBox), else empty.
    """

    key_path: str
    index: int
    dtype: np.dtype
    dtype_name: str
    shape: Tuple[int, ...]
    value_kind: str
    codec: str
    filter: str
    byte_length: int
    stored_bytes: int
    chunk_size: int
    num_chunks: int
    num_parts: int
    logical_axes: Tuple[str, ...]
    sharding: Optional[ShardingInfo]
    metadata: Mapping[str, str]
    shards: Tuple[ShardBox, ...] = ()

    # True when ``archive[key]`` is a view of the mapped file: a leaf the
    # core views (raw, in one part, a local archive, not assembled from a
    # sharded checkpoint's boxes) of a dtype of whole bytes (the binding's
    # one rule, which ``Archive[key]`` and ``load(copy=False)`` follow too).
    zero_copy: bool = False


def leaf_info(d: Dict[str, Any]) -> LeafInfo:
    """The LeafInfo of a leaf description as ``_core.Archive.leaf`` gives it."""
    sh = d["sharding"]
    sharding = None if sh is None else ShardingInfo(tuple(sh[0]), tuple(int(s) for s in sh[1]),
                                                    tuple(tuple(a) for a in sh[2]))
    return LeafInfo(
        key_path=d["key_path"], dtype=_dtypes.to_numpy(d["dtype"]), dtype_name=d["dtype"],
        shape=tuple(int(s) for s in d["shape"]), value_kind=_codec.VALUE_KIND_NAMES[d["value_kind"]],
        codec=d["codec"], filter=d["filter"], logical_axes=tuple(d["logical_axes"]), sharding=sharding,
        metadata=dict(d["metadata"]), shards=tuple(ShardBox(f, k, tuple(b), tuple(e)) for f, k, b, e in d["shards"]),
        zero_copy=bool(d["zero_copy"]),
        **{k: int(d[k]) for k in ("index", "byte_length", "stored_bytes", "chunk_size", "num_chunks", "num_parts")})


@dataclass(frozen=True)
class TreeNode:
    """One treedef node (pre-order; SPEC.md "Treedef"): ``kind`` is one of
    "leaf", "none", "dict", "list", "tuple", "namedtuple", "dataclass";
    ``arity`` is its number of children (0 for "leaf" and "none");
    ``type_name`` the qualified Python type name of a namedtuple or
    dataclass (e.g. "optax.ScaleByAdamState"; may be empty); ``keys`` are dict keys or field
    names, one per child (empty for lists and tuples)."""

    kind: str
    arity: int
    type_name: str
    keys: Tuple[str, ...]


@dataclass(frozen=True)
class SaveStats:
    """What save() wrote. ``file_bytes``: size of the archive file(s) in
    bytes; ``raw_bytes``: the leaves' bytes as given; ``stored_bytes``: the
    bytes their chunks take in the file(s) (smaller where LZ4 paid);
    ``num_leaves``, ``num_blobs``: counts. For a sharded checkpoint (several
    processes) ``file_bytes``, ``stored_bytes`` and ``num_blobs`` are summed
    over every file written (each process's and the index), while
    ``raw_bytes`` and ``num_leaves`` count each global leaf once."""

    file_bytes: int
    raw_bytes: int
    stored_bytes: int
    num_leaves: int
    num_blobs: int


for _cls in (ShardingInfo, ShardBox, LeafInfo, TreeNode, SaveStats):
    _cls.__module__ = "treecask"
del _cls
