"""The sharded checkpoint directory (format 3.1, format/SPEC.md "Sharded
checkpoints") as a reader: :class:`ShardedArchive`, the
:class:`~treecask._reader.Reader` over one ``_core.ShardedArchive``, whose
binding has ``_core.Archive``'s read methods over the global leaves (the
index archive's facts, treedef and key lookups; every leaf assembled from the
saved boxes, none a view of a map). Writing one is ``_distributed.py``'s job."""

from __future__ import annotations

import treecask._core as _core

from . import stores
from ._reader import Reader


class ShardedArchive(Reader):
    """A sharded checkpoint directory opened for reading: the interface of
    :class:`treecask.Archive` over the *global* arrays (``info(k).shards``
    the saved boxes); a whole leaf or any hyperslab is assembled from the
    parts of the boxes that intersect it (the C++ ShardedArchive), every file
    opened through one handle of the directory, so a checkpoint replaced
    meanwhile is read whole, old or new (docs/python.md "Multi-process save
    and restore"). ``signature`` and ``public_key``: as for
    :func:`treecask.open`, the directory signed as model_signing signs one.

    Raises what :class:`treecask.Archive` raises, and CorruptionError when a
    shard file is not the one a format 3.1 index was committed with (another
    step, save or job: the message names the file, both manifest fingerprints
    and both save ids), lacks a box the index names, or the boxes do not tile
    a leaf.
    """

    _place_by_slices = True  # a key or 0-d leaf read block by block (Reader.place)

    def __init__(self, path, *, verify_checksums: bool = True, validate_structure: bool = True,
                 storage_options=None, store: "stores.Store | None" = None, signature=None, public_key=None):
        # one handle of a local directory, else each object read by range
        self._open_source("open_sharded", path, store, storage_options, signature, public_key,
                          verify_checksums=verify_checksums, validate_structure=validate_structure)

    def __repr__(self) -> str:
        state = "closed" if self._core is None else f"{len(self)} leaves, {len(self._core.files())} shard files"
        return f"<treecask.ShardedArchive {_core.redact_url(self._path)!r} ({state})>"

    files = property(lambda self: list(self._c().files()),
                     doc="Names of the shard files the index refers to (a sorted list of str).")

    @property
    def file_size(self) -> int:
        """Bytes of the index and every shard file together."""
        s = self._c()
        return int(s.index.file_size) + sum(int(s.file(f).file_size) for f in s.files())
