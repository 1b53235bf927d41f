"""One save as the C++ core takes it: :class:`SaveRequest`, the single argument
of ``_core.save`` and ``_core.save_async`` (``treecask::save``'s treedef, leaf
inputs and ``SaveOptions``; include/treecask/writer.h), and the one route from
a pytree to it (:meth:`SaveRequest.of_tree`). ``treecask.save``, the
CheckpointManager's background save and each file of a multi-process save
(shard files and index) all build one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import treecask._core as _core

from . import _codec
from . import _tree as T
from .errors import Error, InvalidArgumentError, _with_file

# The core's Compression values by option name (include/treecask/writer.h; SPEC.md "Codecs").
_COMPRESSION = _core.COMPRESSIONS


def compression_code(compression: str, file: str) -> int:
    """The core's code of a ``compression`` option ("auto", "none", "lz4"; SPEC.md
    "Codecs", the C++ ``treecask::Compression``). Raises InvalidArgumentError naming ``file``."""
    if compression not in _COMPRESSION:
        raise InvalidArgumentError(
            f"compression must be one of {sorted(_COMPRESSION)}, got {compression!r}", file=file)
    return _COMPRESSION[compression]


def metadata_items(metadata: Optional[Mapping[str, str]], file: str) -> List[Tuple[str, str]]:
    """Archive metadata as the core's (key, value) list, in order. Raises
    InvalidArgumentError naming ``file`` unless it maps str to str."""
    items = list((metadata or {}).items())
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items):
        raise InvalidArgumentError("archive metadata must map str to str", file=file)
    return items


@dataclass
class SaveRequest:
    """The arguments of one ``treecask::save``: the treedef and one entry per
    leaf in each column, then the options (units and rules of
    ``treecask::SaveOptions``, include/treecask/writer.h).

    Columns: ``key_paths`` (str, escaped and joined, SPEC.md "Key paths"),
    ``value_kinds`` (int, ``_core.VALUE_KINDS``), ``dtypes`` (dtype names),
    ``shapes`` (sequences of int), ``datas`` (C-contiguous buffers holding each
    leaf's bytes, little-endian, sub-byte dtypes packed), ``extras`` (leaf
    position -> (logical axes, sharding, metadata pairs[, shard references
    (file, key path, start, stop)])) for the leaves that have any.
    Options: ``compression`` (a ``_core.COMPRESSIONS`` value), ``chunk_size``
    (bytes; None: the core's 1 MiB), ``threads`` (0: all cores),
    ``overwrite``, ``durable``, ``metadata`` ((key, value) pairs),
    ``max_part_bytes`` (bytes; None: 1 GiB), ``shuffle``, ``shard_files``
    ((file, manifest length, manifest XXH3) of each shard file an index binds,
    format 3.1)."""

    nodes: list
    key_paths: List[str]
    value_kinds: List[int]
    dtypes: List[str]
    shapes: List[Sequence[int]]
    datas: List[Any]
    extras: Dict[int, tuple] = field(default_factory=dict)
    compression: int = 0
    chunk_size: Optional[int] = None
    threads: int = 0
    overwrite: bool = False
    durable: bool = True
    metadata: List[Tuple[str, str]] = field(default_factory=list)
    max_part_bytes: Optional[int] = None
    shuffle: bool = False
    shard_files: List[Tuple[str, int, int]] = field(default_factory=list)

    @classmethod
    def of_tree(cls, path: str, tree: Any, *, leaf_extras: Optional[Mapping[str, Any]] = None,
                before_encode: Optional[Callable[[List[Any]], None]] = None,
                **options: Any) -> Tuple["SaveRequest", List[Any]]:
        """Flattens ``tree`` (``_tree.to_treedef``) and encodes every leaf
        (``_codec.encode_all``): the request of a single-file save with
        ``options`` (the fields above), and the flattened leaf objects.
        ``leaf_extras`` replaces the annotations of the leaves it names (by key
        path); ``before_encode`` sees the leaf objects first (e.g. to start
        device-to-host copies). Errors name ``path``."""
        try:
            nodes, key_paths, objs, extras = T.to_treedef(tree)
            if leaf_extras:
                extras = [leaf_extras.get(kp, ex) for kp, ex in zip(key_paths, extras)]
            if before_encode is not None:
                before_encode(objs)
            kinds, dtypes, shapes, datas, more = _codec.encode_all(key_paths, objs, extras)
        except Error as e:
            raise _with_file(e, path) from None
        return cls(nodes, key_paths, kinds, dtypes, shapes, datas, more, **options), objs
